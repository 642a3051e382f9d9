// OpenClaw's exec and process tools as its own tests import them, answered by a procpilot daemon's
// REST face (POST /v1/tools/{exec,process}) serving `--profile openclaw`. A tool call is one HTTP
// request; the result comes back in OpenClaw's shape, { content: [{ type: "text", text }], details },
// and a refusal (an error body) is thrown, as OpenClaw's tools throw.
//
// createExecTool's defaults are OpenClaw's gateway settings; the ones with a per-call counterpart
// on our exec are passed as that argument (timeoutSec -> timeout, backgroundMs -> yieldMs,
// allowBackground: false -> yieldMs: null, notifyOnExit). A scopeKey picks the agent: its token
// from PROCPILOT_SHIM_SCOPES. messageProvider and sessionKey (the chat the gateway runs the tool
// for) go as the X-Procpilot-Context header. Host, security, ask, elevated and pathPrepend are the
// gateway's own configuration (a server's is its config file) and have no per-call form: they are
// not sent.

import { BASE, headers, tokenFor } from "./daemon.mjs";
import { fixtureIdOf, resolveSessionId } from "./registry.mjs";

async function callTool(tool, args, token, signal, chat) {
  const response = await fetch(`${BASE}/v1/tools/${tool}`, {
    method: "POST",
    headers: chat ? { ...headers(token), "x-procpilot-context": chat } : headers(token),
    body: JSON.stringify(args),
    signal,
  });
  const body = await response.json();
  if (body.error !== undefined) {
    throw new Error(body.text ?? body.message ?? body.error);
  }
  return { content: [{ type: "text", text: body.text ?? "" }], details: body.data ?? {} };
}

function execArguments(defaults, params) {
  const args = { ...params };
  // timeoutSec is the gateway's default timeout: like a server's (the config's timeoutSec), it
  // bounds a run started with background: true too; timeout: 0 is none.
  if (defaults.timeoutSec !== undefined && args.timeout === undefined) args.timeout = defaults.timeoutSec;
  if (defaults.allowBackground === false) {
    delete args.background;
    args.yieldMs = null; // never moved to the background: the call waits for the end
  } else if (defaults.backgroundMs !== undefined && args.yieldMs === undefined && !args.background) {
    args.yieldMs = defaults.backgroundMs;
  }
  if (defaults.notifyOnExit !== undefined && args.notifyOnExit === undefined) args.notifyOnExit = defaults.notifyOnExit;
  return args;
}

// The chat the gateway runs this tool for (messageProvider, sessionKey), as the daemon takes it:
// the X-Procpilot-Context header, "provider=telegram session=agent:main:main" (only the parts known).
function chatContext(defaults) {
  const parts = [];
  const provider = defaults.messageProvider?.trim();
  const session = defaults.sessionKey?.trim();
  if (provider) parts.push(`provider=${provider}`);
  if (session) parts.push(`session=${session}`);
  return parts.length > 0 ? parts.join(" ") : undefined;
}

export function createExecTool(defaults = {}) {
  const token = tokenFor(defaults.scopeKey);
  const chat = chatContext(defaults);
  return {
    name: "exec",
    execute: (_toolCallId, params, signal) =>
      callTool("exec", execArguments(defaults, params ?? {}), token, signal, chat),
  };
}

export function createProcessTool(defaults = {}) {
  const token = tokenFor(defaults.scopeKey);
  return {
    name: "process",
    execute: async (_toolCallId, params, signal) => {
      const args = { ...(params ?? {}) };
      if (args.sessionId === undefined) return callTool("process", args, token, signal);
      // A session a test added by hand (registry.mjs) is named by the test's id, the daemon's inside.
      const asked = args.sessionId;
      const real = resolveSessionId(asked);
      const result = await callTool("process", { ...args, sessionId: real }, token, signal);
      if (real === asked) return result;
      const text = result.content[0].text.split(real).join(asked);
      return { content: [{ type: "text", text }], details: { ...result.details, sessionId: fixtureIdOf(real) } };
    },
  };
}

export const execTool = createExecTool();
export const processTool = createProcessTool();

// OpenClaw's module-private helpers, exported for its unit tests: nothing of a server answers them.
export const __testing = {};
