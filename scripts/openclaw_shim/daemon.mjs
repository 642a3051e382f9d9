// Where the daemon is and who the shim speaks for: PROCPILOT_URL, PROCPILOT_TOKEN (the main
// agent) and PROCPILOT_SHIM_SCOPES (a token per OpenClaw scopeKey), as run.sh sets them.
import { fetchJsonSync } from "./sync.mjs";

export const BASE = (process.env.PROCPILOT_URL ?? "http://127.0.0.1:8765").replace(/\/$/, "");
export const TOKEN = process.env.PROCPILOT_TOKEN ?? "";
const SCOPES = JSON.parse(process.env.PROCPILOT_SHIM_SCOPES ?? "{}");

export function tokenFor(scopeKey) {
  if (scopeKey === undefined) return TOKEN;
  const token = SCOPES[scopeKey];
  if (!token) throw new Error(`openclaw shim: no token for scopeKey ${scopeKey} in PROCPILOT_SHIM_SCOPES`);
  return token;
}

export function headers(token = TOKEN) {
  return { authorization: `Bearer ${token}`, "content-type": "application/json" };
}

// One tool call that blocks this thread until the answer (the registry's fixtures need it).
export function callToolSync(tool, args, token = TOKEN) {
  const body = fetchJsonSync(`${BASE}/v1/tools/${tool}`, { method: "POST", headers: headers(token), body: JSON.stringify(args) });
  if (body.error !== undefined) throw new Error(body.text ?? body.message ?? body.error);
  return body;
}

// The main agent's background sessions as GET /v1/sessions lists them (process list's rows).
export function listSessionsSync() {
  return fetchJsonSync(`${BASE}/v1/sessions`, { headers: headers() }).sessions ?? [];
}
