// A connection that dies without a word, and states that outlive what they describe.
// - EventStream with `watch`: heartbeat events (`?heartbeat=event`) say the connection lives and
//   how often they come; two intervals of silence, connecting or connected, fail the source and a
//   new one resumes after the last seq; coming back to the page or online opens a fresh one.
// - The conversation: a tool call never stays "running" after its turn ended, and the command a
//   Cancel killed says "cancelled", not "failed".
// - The Chat view: "Not sent" goes once the connection is back (and the box empties when the
//   message turns out to have arrived); "still working" and "Cancel failed" go when the turn ends.
// Fake EventSource, fake clock and timers stand in for the browser's.

import { test } from "node:test";
import assert from "node:assert/strict";

import { ApiError, EventStream } from "../api.js";
import { applyEvent, createConversation } from "../conversation.js";
import { renderItem } from "../render.js";
import { findAll, textOf } from "../vdom.js";
import { readSse } from "./helpers.mjs";

class FakeSource {
  static all = [];
  constructor(url) {
    this.url = url;
    this.listeners = {};
    this.readyState = 0;
    FakeSource.all.push(this);
  }
  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }
  close() {
    this.readyState = 2;
  }
  open() {
    this.readyState = 1;
    this.onopen?.();
  }
  send(event) {
    for (const listener of this.listeners[event.type] ?? []) listener({ data: JSON.stringify(event) });
  }
  beat(intervalMs) {
    for (const listener of this.listeners.heartbeat ?? []) listener({ data: JSON.stringify({ type: "heartbeat", interval_ms: intervalMs }) });
  }
  fail() {
    for (const listener of this.listeners.error ?? []) listener({ type: "error" });
  }
}

/** A clock and timers that run only when the test moves the clock. */
function fakeClock() {
  let now = 0;
  let nextId = 1;
  const pending = new Map();
  return {
    now: () => now,
    timers: {
      setTimeout: (f, ms) => {
        const id = nextId++;
        pending.set(id, { at: now + ms, f });
        return id;
      },
      clearTimeout: (id) => pending.delete(id),
    },
    pending,
    /** Moves the clock by `ms`, running every timer that falls due, in order. */
    advance(ms) {
      const end = now + ms;
      for (;;) {
        const due = [...pending.entries()].filter(([, t]) => t.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
        if (!due) break;
        pending.delete(due[0]);
        now = due[1].at;
        due[1].f();
      }
      now = end;
    },
  };
}

function harness({ watch = true } = {}) {
  FakeSource.all = [];
  const clock = fakeClock();
  const seen = [];
  const statuses = [];
  const stream = new EventStream({
    url: (after) => `/v1/sessions/s/events?access_token=t&after=${after}&heartbeat=event`,
    onEvent: (event) => seen.push(event.seq),
    onStatus: (status) => statuses.push(status),
    EventSourceImpl: FakeSource,
    timers: clock.timers,
    now: clock.now,
    watch,
  });
  return { stream, seen, statuses, clock, last: () => FakeSource.all.at(-1) };
}

const events = readSse("shell-agent.sse");

test("a stream silent for two heartbeat intervals is replaced, resuming after the last seq", () => {
  const { stream, seen, statuses, clock, last } = harness();
  stream.start(0);
  const first = last();
  first.open();
  first.beat(1000);
  events.slice(0, 3).forEach((e) => first.send(e));
  // The connection freezes: nothing more comes, and no error either.
  clock.advance(1999);
  assert.deepEqual(statuses, ["connected"]);
  assert.equal(FakeSource.all.length, 1);
  clock.advance(1);
  assert.deepEqual(statuses, ["connected", "reconnecting"]);
  assert.equal(first.readyState, 2, "the silent source is closed");
  clock.advance(250);
  const second = last();
  assert.equal(FakeSource.all.length, 2);
  assert.equal(second.url, "/v1/sessions/s/events?access_token=t&after=3&heartbeat=event");
  second.open();
  second.beat(1000);
  // What the frozen source still had in flight is ignored; the new one resends from seq 4.
  first.send(events[3]);
  events.slice(2, 6).forEach((e) => second.send(e));
  assert.deepEqual(seen, [1, 2, 3, 4, 5, 6]);
  assert.deepEqual(statuses, ["connected", "reconnecting", "connected"]);
});

test("heartbeats and events keep a quiet stream connected; heartbeats are not events", () => {
  const { stream, seen, statuses, clock, last } = harness();
  stream.start(0);
  last().open();
  last().beat(1000);
  for (let i = 0; i < 20; i++) {
    clock.advance(1000);
    if (i % 2) last().beat(1000);
    else last().send(events[i / 2]);
  }
  assert.equal(FakeSource.all.length, 1);
  assert.deepEqual(statuses, ["connected"]);
  assert.deepEqual(seen, events.slice(0, 10).map((e) => e.seq), "no heartbeat delivered as an event");
  assert.equal(stream.lastSeq, 10);
  assert.ok(clock.pending.size <= 1, "one timer watches the stream, not one per event");
});

test("the timeout follows the interval the heartbeats give", () => {
  const { stream, statuses, clock, last } = harness();
  stream.start(0);
  last().open();
  // Before any heartbeat: the gateway's default, 15 s, twice.
  clock.advance(29_000);
  assert.deepEqual(statuses, ["connected"]);
  last().beat(300);
  clock.advance(599);
  assert.deepEqual(statuses, ["connected"]);
  clock.advance(1);
  assert.deepEqual(statuses, ["connected", "reconnecting"]);
});

test("a connection that never opens is given up after two intervals and tried again", () => {
  const { stream, statuses, clock, last } = harness();
  stream.start(7);
  last().open();
  last().beat(500);
  last().fail();
  clock.advance(250);
  assert.equal(FakeSource.all.length, 2);
  // The new connection hangs: no open, no error.
  clock.advance(999);
  assert.equal(FakeSource.all.length, 2);
  clock.advance(1);
  assert.equal(FakeSource.all[1].readyState, 2);
  clock.advance(1000);
  assert.equal(FakeSource.all.length, 3);
  assert.ok(FakeSource.all.every((s) => s.url.includes("after=7")));
  last().open();
  assert.deepEqual(statuses, ["connected", "reconnecting", "connected"]);
});

test("coming back to the page opens a fresh source; an overdue one says reconnecting at once", () => {
  const { stream, seen, statuses, clock, last } = harness();
  stream.start(0);
  last().open();
  last().beat(1000);
  last().send(events[0]);
  // Back soon: the connection may have died a moment ago, so a fresh one is opened quietly.
  clock.advance(500);
  stream.wake();
  assert.equal(FakeSource.all.length, 2);
  assert.equal(FakeSource.all[0].readyState, 2);
  assert.ok(last().url.includes("after=1"));
  assert.deepEqual(statuses, ["connected"]);
  last().open();
  last().beat(1000);
  // Back after a heartbeat was missed (timers of a background tab run late, if at all).
  clock.pending.clear();
  clock.advance(1500);
  stream.wake();
  assert.deepEqual(statuses, ["connected", "reconnecting"]);
  assert.equal(FakeSource.all.length, 3);
  last().open();
  last().send(events[0]);
  last().send(events[1]);
  assert.deepEqual(seen, [1, 2]);
  assert.deepEqual(statuses, ["connected", "reconnecting", "connected"]);
});

test("a stopped stream neither wakes nor keeps a timer", () => {
  const { stream, clock, last } = harness();
  stream.start(0);
  last().open();
  stream.stop();
  stream.wake();
  assert.equal(FakeSource.all.length, 1);
  assert.equal(clock.pending.size, 0);
});

test("without watch a silent stream is left alone", () => {
  const { stream, statuses, clock, last } = harness({ watch: false });
  stream.start(0);
  last().open();
  clock.advance(120_000);
  assert.deepEqual(statuses, ["connected"]);
  assert.equal(clock.pending.size, 0);
});

// ---- the conversation: tool calls after their turn ----

function fold(list) {
  const conversation = createConversation();
  for (const event of list) applyEvent(conversation, event);
  return conversation;
}

const toolRow = (item) => textOf(renderItem(item).children[0]);
const buttons = (item) => findAll(renderItem(item), (n) => n.tag === "button");
const turn = (n, seq, rest) => [
  { seq, turn: n, type: "user_message", text: "make" },
  { seq: seq + 1, turn: n, type: "turn_start" },
  { seq: seq + 2, turn: n, type: "update", update: { sessionUpdate: "tool_call", toolCallId: `cmd-${n}`, title: "make", kind: "execute" } },
  { seq: seq + 3, turn: n, type: "update", update: { sessionUpdate: "tool_call_update", toolCallId: `cmd-${n}`, status: "in_progress", content: [{ type: "terminal", terminalId: "9" }] } },
  ...rest.map((event, i) => ({ seq: seq + 4 + i, turn: n, ...event })),
];

test("a command still running when its turn ends is not listed as running", () => {
  for (const [reason, words, cls] of [["interrupted", "interrupted", "tool-ended"], ["end_turn", "ended", "tool-ended"], ["error", "ended", "tool-ended"]]) {
    const conversation = createConversation();
    turn(1, 1, []).forEach((e) => applyEvent(conversation, e));
    const tool = conversation.items.find((i) => i.kind === "tool");
    assert.equal(toolRow(tool), "execute make running");
    assert.equal(buttons(tool).length, 1, "Watch while it runs");
    const changed = applyEvent(conversation, { seq: 5, turn: 1, type: "turn_end", stop_reason: reason });
    assert.ok(changed.includes(tool), `${reason}: the tool call is re-rendered`);
    assert.equal(toolRow(tool), `execute make ${words}`, reason);
    assert.match(renderItem(tool).attrs.class, new RegExp(`\\b${cls}\\b`));
    assert.equal(buttons(tool).length, 0, `${reason}: nothing left to watch`);
  }
});

test("the command a Cancel killed says cancelled, not failed", () => {
  const conversation = fold(events);
  const sleep = conversation.items.find((i) => i.kind === "tool" && i.title === "sleep 30");
  assert.equal(toolRow(sleep), "execute sleep 30 cancelled");
  assert.match(renderItem(sleep).attrs.class, /\btool-cancelled\b/);
  // The other failures of the recording keep their word: a refused permission, a non-zero exit.
  const rows = conversation.items.filter((i) => i.kind === "tool").map(toolRow);
  assert.ok(rows.includes("execute false failed (exit 1)"), rows.join("\n"));
  assert.ok(rows.includes("execute rm -f nothing failed"), rows.join("\n"));
  // The same events one at a time: the change comes with the turn's end.
  const live = createConversation();
  const changed = events.filter((e) => e.seq <= 47).map((e) => applyEvent(live, e));
  assert.ok(changed.at(-1).some((i) => i.kind === "tool" && i.title === "sleep 30"));
});

test("a command that failed on its own before a Cancel stays failed", () => {
  const conversation = fold(
    turn(1, 1, [
      { type: "update", update: { sessionUpdate: "tool_call_update", toolCallId: "cmd-1", status: "failed", rawOutput: { exit_code: 2, signal: null } } },
      { type: "update", update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "make failed; trying again\n" } } },
      { type: "update", update: { sessionUpdate: "tool_call", toolCallId: "cmd-1b", title: "make -k", kind: "execute", status: "in_progress" } },
      { type: "update", update: { sessionUpdate: "tool_call", toolCallId: "cmd-1c", title: "ls", kind: "read", status: "pending" } },
      { type: "update", update: { sessionUpdate: "tool_call_update", toolCallId: "cmd-1c", status: "failed" } },
      { type: "update", update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "hm\n" } } },
      { type: "update", update: { sessionUpdate: "tool_call_update", toolCallId: "cmd-1b", status: "failed" } },
      { type: "turn_end", stop_reason: "cancelled" },
    ]),
  );
  const rows = conversation.items.filter((i) => i.kind === "tool").map(toolRow);
  assert.deepEqual(rows, ["execute make failed (exit 2)", "execute make -k cancelled", "read ls failed"]);
});

test("a completed update that comes after the turn's end wins", () => {
  const conversation = fold([
    ...turn(1, 1, [{ type: "turn_end", stop_reason: "end_turn" }]),
    { seq: 6, turn: 1, type: "update", update: { sessionUpdate: "tool_call_update", toolCallId: "cmd-1", status: "completed", rawOutput: { exit_code: 0 } } },
  ]);
  assert.equal(toolRow(conversation.items.find((i) => i.kind === "tool")), "execute make done");
});

test("tool calls of earlier turns are left as they were", () => {
  const conversation = fold([
    ...turn(1, 1, [{ type: "update", update: { sessionUpdate: "tool_call_update", toolCallId: "cmd-1", status: "completed" } }, { type: "turn_end", stop_reason: "end_turn" }]),
    ...turn(2, 7, [{ type: "turn_end", stop_reason: "cancelled" }]),
  ]);
  assert.deepEqual(conversation.items.filter((i) => i.kind === "tool").map(toolRow), ["execute make done", "execute make cancelled"]);
});

// ---- the Chat view's errors ----

class El {
  constructor() {
    this.listeners = {};
    this.value = "";
    this.textContent = "";
    this.hidden = true;
    this.disabled = false;
    this.attributes = new Map();
  }
  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }
  replaceChildren() {}
  setAttribute(name, value) {
    this.attributes.set(name, value);
  }
  removeAttribute(name) {
    this.attributes.delete(name);
  }
}

/** A Chat view on fake elements, a fake EventSource and an API whose answers the test gives:
 *  `answers` maps "METHOD path-end" to a function returning the result or throwing. */
async function chatHarness(answers) {
  FakeSource.all = [];
  const store = new Map();
  globalThis.localStorage = {
    getItem: (k) => (store.has(k) ? store.get(k) : null),
    setItem: (k, v) => store.set(k, String(v)),
    removeItem: (k) => store.delete(k),
  };
  globalThis.window = new El();
  globalThis.document = Object.assign(new El(), { hidden: false });
  globalThis.requestAnimationFrame = () => 0;
  globalThis.EventSource = FakeSource;
  const { ChatView } = await import("../chat.js");
  const el = { log: new El(), form: new El(), message: new El(), cancel: new El(), error: new El() };
  const statuses = [];
  const requests = [];
  const api = {
    token: "wr_t",
    async request(method, path, options) {
      requests.push([method, path, options?.json]);
      const answer = Object.entries(answers).find(([key]) => {
        const [m, end] = key.split(" ");
        return m === method && path.endsWith(end);
      });
      return answer ? answer[1](options) : {};
    },
  };
  const view = new ChatView({ elements: el, api, onEvent: () => {}, onStatus: (s) => statuses.push(s), onWatch: () => {} });
  view.open({ id: "s1", last_seq: 0 });
  const source = () => FakeSource.all.at(-1);
  source().open();
  return { view, el, statuses, requests, source, store };
}

const offline = () => {
  throw new ApiError(0, "NETWORK", "the gateway did not answer (Failed to fetch)");
};

test("the chat's stream asks for heartbeat events and watches them", async () => {
  const { view, source } = await chatHarness({});
  assert.match(source().url, /^\/v1\/sessions\/s1\/events\?access_token=wr_t&after=0&heartbeat=event$/);
  assert.equal(view.stream.watch, true);
  view.close();
});

test("'Not sent' goes once the connection is back; the message stays in the box", async () => {
  const { view, el, source } = await chatHarness({ "POST /messages": offline });
  el.message.value = "echo later";
  await view.send();
  assert.equal(el.error.hidden, false);
  assert.match(el.error.textContent, /^Not sent: /);
  source().fail();
  assert.equal(el.error.hidden, false, "still true while reconnecting");
  view.stream.reconnectNow();
  source().open();
  assert.equal(el.error.hidden, true);
  assert.equal(el.error.textContent, "");
  assert.equal(el.message.value, "echo later", "nothing typed is lost");
  view.close();
});

test("a message that got no answer but did arrive leaves the box and takes 'Not sent' with it", async () => {
  const { view, el, source, store } = await chatHarness({ "POST /messages": offline });
  el.message.value = "echo arrived";
  store.set("warren.draft.s1", "echo arrived");
  await view.send();
  assert.match(el.error.textContent, /^Not sent: /);
  source().send({ seq: 1, turn: 1, type: "user_message", text: "echo arrived" });
  assert.equal(el.error.hidden, true);
  assert.equal(el.message.value, "");
  assert.equal(store.has("warren.draft.s1"), false);
  view.close();
});

test("a message already seen when its POST fails is not said to be unsent", async () => {
  let source;
  const { view, el, ...rest } = await chatHarness({
    "POST /messages": () => {
      source().send({ seq: 1, turn: 1, type: "user_message", text: "echo quick" });
      offline();
    },
  });
  source = rest.source;
  el.message.value = "echo quick";
  await view.send();
  assert.equal(el.error.hidden, true);
  assert.equal(el.message.value, "");
  view.close();
});

test("a different message arriving keeps 'Not sent' and the box", async () => {
  const { view, el, source } = await chatHarness({ "POST /messages": offline });
  el.message.value = "echo mine";
  await view.send();
  source().send({ seq: 1, turn: 1, type: "user_message", text: "echo from another device" });
  assert.match(el.error.textContent, /^Not sent: /);
  assert.equal(el.message.value, "echo mine");
  view.close();
});

test("'still working' and 'Cancel failed' go when the turn ends", async () => {
  const { view, el, source } = await chatHarness({
    "POST /messages": () => {
      throw new ApiError(409, "TURN_IN_PROGRESS", "a turn is running");
    },
    "POST /cancel": () => {
      throw new ApiError(500, "INTERNAL", "boom");
    },
  });
  source().send({ seq: 1, turn: 1, type: "user_message", text: "sleep 5" });
  source().send({ seq: 2, turn: 1, type: "turn_start" });
  el.message.value = "echo next";
  await view.send();
  assert.match(el.error.textContent, /still working/);
  source().send({ seq: 3, turn: 1, type: "turn_end", stop_reason: "end_turn" });
  assert.equal(el.error.hidden, true);

  source().send({ seq: 4, turn: 2, type: "user_message", text: "sleep 5" });
  source().send({ seq: 5, turn: 2, type: "turn_start" });
  await view.cancel();
  assert.match(el.error.textContent, /^Cancel failed: boom/);
  source().send({ seq: 6, turn: 2, type: "turn_end", stop_reason: "cancelled" });
  assert.equal(el.error.hidden, true);
  view.close();
});

test("an error a reconnect does not fix stays", async () => {
  const { view, el, source } = await chatHarness({
    "POST /messages": () => {
      throw new ApiError(400, "INVALID_REQUEST_BODY", "text is empty");
    },
  });
  el.message.value = "x";
  await view.send();
  source().fail();
  view.stream.reconnectNow();
  source().open();
  assert.match(el.error.textContent, /^Not sent: text is empty/);
  view.close();
});
