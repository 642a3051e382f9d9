// A blocking HTTP call, for the registry functions OpenClaw's tests call synchronously (getSession
// inside an expect.poll callback, addSession before a tool call): a worker thread makes the request
// while this thread waits on a shared word, then reads the answer off a message port.
import { MessageChannel, Worker, receiveMessageOnPort } from "node:worker_threads";

const WORKER = `
const { parentPort } = require("node:worker_threads");
parentPort.on("message", async ({ url, init, port, done }) => {
  let reply;
  try {
    const response = await fetch(url, init);
    reply = { status: response.status, body: await response.text() };
  } catch (error) {
    reply = { error: String(error) };
  }
  port.postMessage(reply);
  Atomics.store(done, 0, 1);
  Atomics.notify(done, 0);
});
`;

let worker;

export function fetchJsonSync(url, init = {}) {
  if (worker === undefined) {
    worker = new Worker(WORKER, { eval: true });
    worker.unref(); // the test run ends without waiting for it
  }
  const done = new Int32Array(new SharedArrayBuffer(4));
  const { port1, port2 } = new MessageChannel();
  worker.postMessage({ url, init, port: port2, done }, [port2]);
  if (Atomics.wait(done, 0, 0, 30_000) === "timed-out") throw new Error(`openclaw shim: no answer from ${url}`);
  const reply = receiveMessageOnPort(port1)?.message;
  port1.close();
  if (reply === undefined || reply.error !== undefined) throw new Error(`openclaw shim: ${url}: ${reply?.error}`);
  return JSON.parse(reply.body);
}

// A pause of this thread (the fixture waits for the daemon to see a change), not of the clock.
export function pauseSync(ms) {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}
