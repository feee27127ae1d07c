// The terminal protocol's client side: offsets across replays and reconnects (no byte shown
// twice, none lost), the attach URL, and the key bar's bytes.

import { test } from "node:test";
import assert from "node:assert/strict";

import { OutputCursor, keyBytes, stdinFrame, terminalUrl, withCtrl } from "../terminal-protocol.js";

const enc = new TextEncoder();
const dec = new TextDecoder();

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
function show(cursor, frames) {
  return frames.map((f) => dec.decode(cursor.accept(f).bytes)).join("");
}

test("replay then live output advance the offset", () => {
  const cursor = new OutputCursor();
  assert.equal(show(cursor, [replay(0, "$ echo hi\r\nhi\r\n"), live("$ "), live("ls")]), "$ echo hi\r\nhi\r\n$ ls");
  assert.equal(cursor.offset, 19);
});

test("a reconnect's replay from since shows only the missed bytes", () => {
  const cursor = new OutputCursor(10);
  assert.equal(show(cursor, [replay(10, "missed"), live("+live")]), "missed+live");
  assert.equal(cursor.offset, 21);
});

test("a replay overlapping what was shown is cut where the screen is", () => {
  const cursor = new OutputCursor(4);
  assert.equal(show(cursor, [replay(0, "abcdefgh")]), "efgh");
  assert.equal(show(cursor, [replay(0, "abcdefgh")]), "", "a replay entirely seen adds nothing");
  assert.equal(cursor.offset, 8);
});

test("a replay past the offset reports the bytes the ring no longer had", () => {
  const cursor = new OutputCursor(0);
  const { bytes, missed } = cursor.accept(replay(100, "tail"));
  assert.deepEqual([dec.decode(bytes), missed, cursor.offset], ["tail", 100, 104]);
});

test("viewer frames (all replays with offsets) show each byte once", () => {
  const cursor = new OutputCursor();
  assert.equal(show(cursor, [replay(0, "one "), replay(4, "two "), replay(8, "three")]), "one two three");
});

test("unknown channels and short frames are ignored", () => {
  const cursor = new OutputCursor(3);
  assert.equal(show(cursor, [Uint8Array.from([0x07, 65]), Uint8Array.from([0x03, 0, 0])]), "");
  assert.equal(cursor.offset, 3);
});

test("the attach URL carries the token, since and the mode", () => {
  const base = "http://127.0.0.1:8080";
  assert.equal(terminalUrl(base, "s1", "default", { token: "wr_x", since: 0 }), "ws://127.0.0.1:8080/v1/sessions/s1/terminals/default/ws?access_token=wr_x&since=0");
  assert.equal(terminalUrl("https://w.example", "s1", "term-7", { token: "t", since: 42, viewer: true }), "wss://w.example/v1/sessions/s1/terminals/term-7/ws?access_token=t&since=42&mode=viewer");
  assert.equal(terminalUrl(base, "s1", "default", { token: "t", since: 5, takeover: true }), "ws://127.0.0.1:8080/v1/sessions/s1/terminals/default/ws?access_token=t&since=5&takeover=1");
});

test("stdin frames are channel 0 then UTF-8", () => {
  assert.deepEqual([...stdinFrame("é\r")], [0x00, 0xc3, 0xa9, 0x0d]);
});

const keys = [
  ["Esc", false, "\x1b"],
  ["Tab", false, "\t"],
  ["Ctrl-C", false, "\x03"],
  ["Up", false, "\x1b[A"],
  ["Down", false, "\x1b[B"],
  ["Right", false, "\x1b[C"],
  ["Left", false, "\x1b[D"],
  ["Up", true, "\x1bOA"],
];
for (const [key, applicationCursor, bytes] of keys) {
  test(`key bar: ${key}${applicationCursor ? " (application cursor mode)" : ""}`, () => assert.equal(keyBytes(key, applicationCursor), bytes));
}

test("Ctrl then a key sends the control character", () => {
  assert.deepEqual(["c", "D", "[", " ", "?", "1", "ab"].map(withCtrl), ["\x03", "\x04", "\x1b", "\x00", "\x7f", "1", "ab"]);
});
