// OpenClaw's gateway-side modules its exec tests mock (shell-env.js, exec-approvals.js): a module
// of their own here, so a test's vi.mock of one replaces only it.
// ../infra/shell-env.js: OpenClaw asks the user's login shell for its PATH before a gateway run;
// the daemon's commands get the daemon's environment (its config's [env]), so nothing is asked.
export const getShellPathFromLoginShell = () => null;
export const resolveShellEnvFallbackTimeoutMs = () => 0;

// ../infra/exec-approvals.js: OpenClaw's approvals file; the daemon's policy is its config's.
export const resolveExecApprovals = () => undefined;
