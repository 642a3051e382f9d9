// The small helpers OpenClaw's exec/process tests import from elsewhere in its tree, written here.
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

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

// ../infra/system-events.js: OpenClaw's in-process event queue (exit notices go to the agent's
// own event stream here: SSE, MCP, WebSocket), so the queue a test peeks at is always empty.
export const peekSystemEvents = () => [];
export function resetSystemEventsForTest() {}

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
