// OpenClaw's real exec tool, called in-process the way its agent loop calls it, for bench/run.py.
// Usage: node openclaw_exec.mjs INSTALL_DIR N IDLE_N IDLE_MS  (INSTALL_DIR holds node_modules/openclaw)
// Prints one JSON object: per-call milliseconds of OpenClaw's `exec true` and of Node's own
// spawnSync("/bin/sh", ["-c", "true"]) (the raw floor in this process), back to back and after
// IDLE_MS of quiet before each call.
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

const [dir, n, idleN, idleMs] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4]), Number(process.argv[5])];
const pkg = join(dir, "node_modules", "openclaw");
const dist = join(pkg, "dist");
// The module that exports createExecTool (its file name carries a build hash).
const entry = readdirSync(dist).find(
  (f) => /^bash-tools-[^.]*\.mjs$/.test(f) && readFileSync(join(dist, f), "utf8").includes("export { createExecTool,"),
);
if (!entry) throw new Error(`no bash-tools module exporting createExecTool in ${dist}`);
const { createExecTool } = await import(pathToFileURL(join(dist, entry)).href);
const tool = createExecTool({});
let calls = 0;

async function openclaw() {
  const result = await tool.execute(`bench-${++calls}`, { command: "true" });
  if (result?.details?.exitCode !== 0) throw new Error(`exec true failed: ${JSON.stringify(result).slice(0, 400)}`);
}
async function raw() {
  const done = spawnSync("/bin/sh", ["-c", "true"]);
  if (done.status !== 0) throw new Error("sh -c true failed");
}
async function timed(fn) {
  const t0 = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t0) / 1e6;
}

for (let i = 0; i < 10; i++) {
  await openclaw();
  await raw();
}
const out = { version: JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")).version, node: process.version };
for (const key of ["exec", "raw", "idle_exec", "idle_raw"]) out[key] = [];
for (let i = 0; i < n; i++) {
  out.exec.push(await timed(openclaw));
  out.raw.push(await timed(raw));
}
for (let i = 0; i < idleN; i++) {
  await sleep(idleMs);
  out.idle_raw.push(await timed(raw));
  await sleep(idleMs);
  out.idle_exec.push(await timed(openclaw));
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0); // its background timers (cleanup sweeps) would keep the process alive
