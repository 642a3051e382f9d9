// OpenClaw's in-process session registry, as its tests import it, answered by the daemon: a
// session is looked up in GET /v1/sessions (getSession: a running one, getFinishedSession: one
// that ended), and a fixture a test adds by hand (createProcessSessionFixture + addSession) is a
// real background session on the daemon, a `cat` of a FIFO in a terminal (stdin writable, silent
// until written), whose output appendOutput writes and whose end markExited causes (always exit 0:
// a code or signal it is given is not reproduced; the tests run here end their fixtures so). A
// fixture keeps the id the test gave it: tools.mjs turns it into the daemon's id and back.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { callToolSync, listSessionsSync } from "./daemon.mjs";
import { pauseSync } from "./sync.mjs";

const fixtures = new Map(); // the test's id -> { realId, fifo, dir, fd }
const WAIT_MS = 5_000;

export const resolveSessionId = (id) => fixtures.get(id)?.realId ?? id;

export function fixtureIdOf(realId) {
  for (const [id, fixture] of fixtures) if (fixture.realId === realId) return id;
  return realId;
}

function row(id) {
  const real = resolveSessionId(id);
  return listSessionsSync().find((each) => each.sessionId === real);
}

export function getSession(id) {
  const found = row(id);
  if (!found || found.status !== "running") return undefined;
  return { id, pid: found.pid ?? undefined, command: found.command, backgrounded: true, exited: false };
}

export function getFinishedSession(id) {
  const found = row(id);
  if (!found || found.status === "running" || found.status === "queued") return undefined;
  return { id, status: found.status, exitCode: found.exitCode, exitSignal: found.exitSignal, command: found.command };
}

export function listRunningSessions() {
  return listSessionsSync()
    .filter((each) => each.status === "running")
    .map((each) => ({ id: fixtureIdOf(each.sessionId), pid: each.pid, command: each.command, exited: false }));
}

export function createProcessSessionFixture(options) {
  return { ...options, exited: false };
}

export function addSession(session) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "openclaw-shim-fixture-"));
  const fifo = path.join(dir, "output");
  execFileSync("mkfifo", [fifo]);
  const started = callToolSync("exec", { command: `stty -echo; exec cat '${fifo}'`, pty: true, background: true });
  fixtures.set(session.id, { realId: started.data.sessionId, fifo, dir, fd: undefined });
}

function until(done, what) {
  const deadline = Date.now() + WAIT_MS;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`openclaw shim: ${what} not seen within ${WAIT_MS} ms`);
    pauseSync(5);
  }
}

function writer(fixture) {
  if (fixture.fd === undefined) {
    // Non-blocking: ENXIO until `cat` has the FIFO open for reading.
    until(() => {
      try {
        fixture.fd = fs.openSync(fixture.fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
        return true;
      } catch (error) {
        if (error.code !== "ENXIO") throw error;
        return false;
      }
    }, "the fixture's reader");
  }
  return fixture.fd;
}

export function appendOutput(session, _stream, text) {
  const fixture = fixtures.get(session.id);
  fs.writeSync(writer(fixture), text);
  // The daemon has it once log shows it: a poll right after this call sees it as OpenClaw's would.
  const wanted = text.trim();
  until(() => callToolSync("process", { action: "log", sessionId: fixture.realId }).text.includes(wanted), "the output");
}

export function markExited(session) {
  const fixture = fixtures.get(session.id);
  fs.closeSync(writer(fixture)); // end of file: `cat` exits 0
  fixture.fd = null;
  until(() => listSessionsSync().some((each) => each.sessionId === fixture.realId && each.status !== "running"), "the exit");
}

export function resetProcessRegistryForTests() {
  for (const fixture of fixtures.values()) {
    if (typeof fixture.fd === "number") fs.closeSync(fixture.fd);
    try {
      callToolSync("process", { action: "remove", sessionId: fixture.realId });
    } catch {
      // already gone
    }
    fs.rmSync(fixture.dir, { recursive: true, force: true });
  }
  fixtures.clear();
}

export const markBackgrounded = () => {};
