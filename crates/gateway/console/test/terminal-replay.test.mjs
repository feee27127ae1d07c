// Replayed output is drawn but never answered: xterm.js answers the queries it parses (device
// attributes, cursor position, colours) through `onData`, which the console sends to the PTY as
// typed input, so a reattach that replays vim's start-up would type `^[[?1;2c^[[1;1R…` into the
// shell. The oracle is the console's own vendored xterm.js (its core runs in node without a
// screen), wired as terminal.js wires it: OutputCursor, `term.write(bytes, filter.parsed(replay))`
// and `term.onData(filter.data)`.

import { test } from "node:test";
import assert from "node:assert/strict";

import { OutputCursor, ReplayAnswerFilter } from "../terminal-protocol.js";
import { Terminal } from "../vendor/xterm/xterm.mjs";

const enc = new TextEncoder();

function live(text) {
  return Uint8Array.from([0x01, ...enc.encode(text)]);
}
function replay(offset, text) {
  const bytes = enc.encode(text);
  const frame = new Uint8Array(9 + bytes.length);
  new DataView(frame.buffer).setBigUint64(1, BigInt(offset));
  frame[0] = 0x03;
  frame.set(bytes, 9);
  return frame;
}

// What vim (and other full-screen programs) ask the terminal when they start.
const QUERIES = "\x1b[c" + "\x1b[>c" + "\x1b[6n" + "\x1b]10;?\x07" + "\x1b]11;?\x07";
const FG = "\x1b]10;rgb:1f1f/2323/2828\x1b\\";
const BG = "\x1b]11;rgb:ffff/ffff/ffff\x1b\\";

/** terminal.js's output path and input path around a real xterm; `sent` is what the PTY got. */
function harness() {
  const term = new Terminal({ cols: 80, rows: 24, allowProposedApi: true });
  // Without a screen xterm has no theme and leaves colour queries unanswered; in the browser it
  // answers them synchronously while parsing, as this does.
  term.parser.registerOscHandler(10, (data) => (data === "?" && term.input(FG, false), false));
  term.parser.registerOscHandler(11, (data) => (data === "?" && term.input(BG, false), false));
  const cursor = new OutputCursor();
  const sent = [];
  const filter = new ReplayAnswerFilter((data) => sent.push(data));
  term.onData((data) => filter.data(data));
  const receive = (frame) => {
    const { bytes } = cursor.accept(frame);
    if (bytes.length > 0) term.write(bytes, filter.parsed(frame[0] === 0x03));
  };
  /** Everything written so far is parsed and every task that emitted input has ended. */
  const settled = async () => {
    await new Promise((resolve) => term.write("", resolve));
    await new Promise((resolve) => setTimeout(resolve, 0));
  };
  const type = (keys) => term.input(keys, true); // what xterm does for a key or a paste
  return { term, sent, receive, settled, type };
}

test("the oracle answers these queries when they are live", async (t) => {
  const { term, sent, receive, settled } = harness();
  t.after(() => term.dispose());
  receive(live(`$ vim\r\n${QUERIES}`));
  await settled();
  assert.deepEqual(sent, ["\x1b[?1;2c", "\x1b[>0;276;0c", "\x1b[2;1R", FG, BG]);
});

test("a replay's queries send nothing to the PTY", async (t) => {
  const { term, sent, receive, settled } = harness();
  t.after(() => term.dispose());
  receive(replay(0, `$ vim\r\n${QUERIES}~\r\n~\r\n`));
  await settled();
  assert.deepEqual(sent, []);
  assert.equal(term.buffer.active.getLine(0).translateToString(true), "$ vim", "the replay is drawn");
});

test("after a replay, a live query is answered and typed keys are sent", async (t) => {
  const { term, sent, receive, settled, type } = harness();
  t.after(() => term.dispose());
  receive(replay(0, `$ vim\r\n${QUERIES}\r\n$ `));
  await settled();
  receive(live("\x1b[6n"));
  await settled();
  type("echo after-reattach\r");
  await settled();
  assert.deepEqual(sent, ["\x1b[3;3R", "echo after-reattach\r"]);
});

test("keys typed while the replay is being parsed are sent, its answers are not", async (t) => {
  const { term, sent, receive, settled, type } = harness();
  t.after(() => term.dispose());
  receive(replay(0, `$ vim\r\n${QUERIES}`));
  type("a"); // before xterm parsed the replay (it parses in a later task)
  await settled();
  type("b");
  await settled();
  assert.deepEqual(sent, ["a", "b"]);
});

test("replay and live frames parsed in one task: only the live queries are answered", async (t) => {
  const { term, sent, receive, settled, type } = harness();
  t.after(() => term.dispose());
  const text = `x${QUERIES}`;
  receive(replay(0, text));
  receive(live("\x1b[5n")); // device status: "\x1b[0n"
  type("k");
  receive(live("\x1b]10;?\x07"));
  await settled();
  assert.deepEqual(sent, ["k", "\x1b[0n", FG]);
  // A later replay (a reconnect) is quiet again.
  receive(replay(text.length + 12, QUERIES));
  await settled();
  assert.deepEqual(sent, ["k", "\x1b[0n", FG]);
});

test("a replay of the whole ring, queries scattered through it, sends nothing", async (t) => {
  const { term, sent, receive, settled, type } = harness();
  t.after(() => term.dispose());
  const lines = [];
  for (let i = 0, length = 0; length < 1 << 20; i++) {
    lines.push(i % 500 === 0 ? `${QUERIES}line ${i}\r\n` : `line ${i} ${"-".repeat(60)}\r\n`);
    length += lines.at(-1).length;
  }
  receive(replay(0, lines.join("")));
  await settled();
  type("q");
  await settled();
  assert.deepEqual(sent, ["q"]);
});

test("with no output being parsed, input goes straight through", () => {
  const sent = [];
  const filter = new ReplayAnswerFilter((data) => sent.push(data));
  filter.data("x");
  assert.deepEqual(sent, ["x"], "sent at once, not at the end of the task");
});
