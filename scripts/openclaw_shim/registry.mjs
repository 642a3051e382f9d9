// OpenClaw's in-process session registry, as its tests import it. Sessions live in the daemon, not
// in this process: resetting is a no-op (each test makes its own sessions), and the functions that
// reach into the registry (a session object, a fixture added by hand) have no counterpart over REST.

export function resetProcessRegistryForTests() {}

function inProcessOnly(name) {
  return () => {
    throw new Error(`openclaw shim: ${name} reads OpenClaw's in-process registry; a server has none`);
  };
}

export const getFinishedSession = () => undefined;
export const getSession = () => undefined;
export const addSession = inProcessOnly("addSession");
export const appendOutput = inProcessOnly("appendOutput");
export const markExited = inProcessOnly("markExited");
export const markBackgrounded = inProcessOnly("markBackgrounded");
export const createProcessSessionFixture = inProcessOnly("createProcessSessionFixture");
