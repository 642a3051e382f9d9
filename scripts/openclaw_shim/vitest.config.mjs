// Runs OpenClaw's own exec/process test files (fetched into OPENCLAW_TESTS, outside this repo)
// with their imports of OpenClaw's modules answered by this shim (see README.md).
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = process.env.OPENCLAW_TESTS;
if (!root) throw new Error("set OPENCLAW_TESTS to the directory that holds OpenClaw's src/agents/*.test.ts");
const shim = (name) => path.join(here, name);

// Modules a test replaces with vi.mock() must be files at their own path (vi.mock does not follow
// an alias): each is written into the fetched tree as a one-line re-export of the shim's.
for (const name of ["shell-env", "exec-approvals"]) {
  const file = path.join(root, "src", "infra", `${name}.js`);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `export * from ${JSON.stringify(shim("gateway.mjs"))};\n`);
}

const alias = [
      { find: /^\.\/bash-tools(\.exec|\.process)?(\.js)?$/, replacement: shim("tools.mjs") },
      { find: /^\.\/bash-process-registry(\.test-helpers|\.test-support)?(\.js)?$/, replacement: shim("registry.mjs") },
      { find: /^\.\.\/infra\/system-events\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\.\/test-utils\/env\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\.\/test-utils\/temp-dir\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\.\/utils\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\.\/process\/kill-tree\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\.\/logging\/diagnostic-session-state\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\/shell-utils\.js$/, replacement: shim("support.mjs") },
      { find: /^\.\/bash-tools\.shared\.js$/, replacement: shim("support.mjs") },
];

export default {
  root,
  resolve: { alias },
  test: {
    include: ["src/agents/**/*.test.ts"],
    testTimeout: 20_000,
    fileParallelism: false, // one daemon: keep the load of one file at a time
  },
};
