// Answering a command (command-input.js): the terminal WebSocket attached as the holder with no
// replay, the line and the Enter of the terminal's mode, a pong before letting go; and every
// way it can fail says so.

import { test } from "node:test";
import assert from "node:assert/strict";

import { commandUrl, lineBytes, sendLine } from "../command-input.js";

test("the URL takes the agent's terminal over, with no replay", () => {
  const url = new URL(commandUrl("https://gw.example:8443", "s 1", "4242", "wr_t"));
  assert.equal(url.protocol, "wss:");
  assert.equal(url.pathname, "/v1/sessions/s%201/terminals/term-4242/ws");
  assert.equal(url.searchParams.get("takeover"), "1");
  assert.equal(url.searchParams.get("access_token"), "wr_t");
  assert.equal(url.searchParams.get("since"), String(Number.MAX_SAFE_INTEGER));
  assert.equal(url.searchParams.get("mode"), null);
});

test("Enter is a newline on pipes and a carriage return on a PTY", () => {
  assert.deepEqual([...lineBytes("bob", "pipe")], [0, 0x62, 0x6f, 0x62, 0x0a]);
  assert.deepEqual([...lineBytes("é", "pty")], [0, 0xc3, 0xa9, 0x0d]);
});

/** A WebSocket the test drives: `script(socket)` answers what the page sends. */
function fakeSocket(script) {
  const sockets = [];
  class FakeSocket {
    constructor(url) {
      this.url = url;
      this.sent = [];
      this.closed = null;
      sockets.push(this);
      queueMicrotask(() => script.open?.(this));
    }
    send(data) {
      this.sent.push(typeof data === "string" ? JSON.parse(data) : [...data]);
      const frame = this.sent.at(-1);
      queueMicrotask(() => script.sent?.(this, frame));
    }
    close(code) {
      if (this.closed !== null) return;
      this.closed = code;
      queueMicrotask(() => this.onclose?.({ code }));
    }
    message(data) {
      this.onmessage?.({ data: typeof data === "string" ? data : data });
    }
  }
  return { FakeSocket, sockets };
}

test("attached as the holder, it writes the line, waits for the pong and lets go", async () => {
  const { FakeSocket, sockets } = fakeSocket({
    open: (s) => {
      s.message(new ArrayBuffer(3)); // output is not needed
      s.message(JSON.stringify({ type: "connected", mode: "pipe", role: "holder" }));
    },
    sent: (s, frame) => frame.type === "ping" && s.message(JSON.stringify({ type: "pong" })),
  });
  await sendLine("ws://x/", "bob", { WebSocketImpl: FakeSocket });
  assert.deepEqual(sockets[0].sent, [[0, 0x62, 0x6f, 0x62, 0x0a], { type: "ping" }]);
  assert.equal(sockets[0].closed, 1000);
});

test("the command ending right after the answer is a success", async () => {
  const { FakeSocket } = fakeSocket({
    open: (s) => s.message(JSON.stringify({ type: "connected", mode: "pty", role: "holder" })),
    sent: (s, frame) => frame.type === "ping" && s.message(JSON.stringify({ type: "exit", exit_code: 0 })),
  });
  await sendLine("ws://x/", "y", { WebSocketImpl: FakeSocket });
});

const failures = [
  ["refused before it attached (the command ended)", { open: (s) => s.close(1006) }, /not running/],
  ["attached only as a viewer", { open: (s) => s.message(JSON.stringify({ type: "connected", mode: "pipe", role: "viewer" })) }, /could not be taken over/],
  ["an error frame", { open: (s) => s.message(JSON.stringify({ type: "error", code: "ALREADY_CONNECTED", error: "another client is connected" })) }, /another client/],
  ["the command had ended", { open: (s) => s.message(JSON.stringify({ type: "exit", exit_code: 1 })) }, /has ended/],
  ["no answer at all", {}, /did not answer in time/],
];
for (const [what, script, error] of failures) {
  test(`fails when ${what}`, async () => {
    const { FakeSocket, sockets } = fakeSocket(script);
    await assert.rejects(sendLine("ws://x/", "bob", { WebSocketImpl: FakeSocket, timeoutMs: 50 }), error);
    assert.ok(sockets[0].closed !== null, "the socket is let go");
  });
}
