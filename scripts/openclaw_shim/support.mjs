// The small helpers OpenClaw's exec/process tests import from elsewhere in its tree, written here.
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { BASE, headers } from "./daemon.mjs";

// ../utils.js
export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ../test-utils/temp-dir.js: a fresh directory under the system temp dir, removed afterwards.
export async function withTempDir(prefix, fn) {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
  try {
    return await fn(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

// ./shell-utils.js: control characters other than tab, newline and carriage return dropped.
export function sanitizeBinaryOutput(text) {
  return String(text).replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/g, "");
}

// ../infra/system-events.js: OpenClaw's in-process queue of events for the agent (an exec that
// ended, with notifyOnExit). Here they are the daemon's event stream for the agent (SSE, GET
// /v1/events): its `exit` events, each as its JSON text, collected from the first reset on.
let systemEvents = [];
let listening = false;

function listenForSystemEvents() {
  if (listening) return;
  listening = true;
  (async () => {
    const response = await fetch(`${BASE}/v1/events`, { headers: headers() });
    const decoder = new TextDecoder();
    let buffer = "";
    for await (const chunk of response.body) {
      buffer += decoder.decode(chunk, { stream: true });
      for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
        const lines = buffer.slice(0, end).split("\n");
        buffer = buffer.slice(end + 2);
        if (lines.includes("event: exit")) {
          systemEvents.push(lines.filter((line) => line.startsWith("data: ")).map((line) => line.slice(6)).join("\n"));
        }
      }
    }
  })().catch(() => {
    listening = false;
  });
}

export function peekSystemEvents() {
  listenForSystemEvents();
  return [...systemEvents];
}

export function resetSystemEventsForTest() {
  listenForSystemEvents();
  systemEvents = [];
}

// ../process/kill-tree.js: the test's clean-up of a session it left running (the daemon's
// process group: the leader's pid is its id).
export function killProcessTree(pid) {
  for (const target of [-pid, pid]) {
    try {
      process.kill(target, "SIGKILL");
      return;
    } catch {
      // not a group leader, or already gone
    }
  }
}

// ../logging/diagnostic-session-state.js: OpenClaw's poll-backoff bookkeeping, kept in-process.
export function resetDiagnosticSessionStateForTest() {}

// ./bash-tools.shared.js: OpenClaw's docker argv builder, not a tool call.
export function buildDockerExecArgs() {
  throw new Error("openclaw shim: buildDockerExecArgs is OpenClaw's docker sandbox internals, not a tool call");
}

// ../test-utils/env.js: a snapshot of some variables of this process, put back by restore().
export function captureEnv(names) {
  const saved = Object.fromEntries(names.map((name) => [name, process.env[name]]));
  return {
    restore() {
      for (const [name, value] of Object.entries(saved)) {
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      }
    },
  };
}
