// EventStream: one EventSource, resumed with `?after=<last seq>` after an error, with no gap and
// no duplicate, and the connection status in words. A fake EventSource and fake timers stand in
// for the browser's.

import { test } from "node:test";
import assert from "node:assert/strict";

import { EventStream } from "../api.js";
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
  fail() {
    for (const listener of this.listeners.error ?? []) listener({ type: "error" });
  }
}

function harness() {
  FakeSource.all = [];
  const timers = [];
  const fakeTimers = {
    setTimeout: (f, ms) => timers.push({ f, ms }) - 1,
    clearTimeout: (id) => {
      if (timers[id]) timers[id].f = () => {};
    },
  };
  const seen = [];
  const statuses = [];
  const stream = new EventStream({
    url: (after) => `/v1/sessions/s/events?access_token=t&after=${after}`,
    onEvent: (event) => seen.push(event.seq),
    onStatus: (status) => statuses.push(status),
    EventSourceImpl: FakeSource,
    timers: fakeTimers,
  });
  const runTimers = () => timers.splice(0).forEach((t) => t.f());
  return { stream, seen, statuses, runTimers, timers };
}

const events = readSse("shell-agent.sse");

test("an error reconnects with after=<last seq> and replayed events are dropped", () => {
  const { stream, seen, statuses, runTimers } = harness();
  stream.start(0);
  const first = FakeSource.all[0];
  assert.equal(first.url, "/v1/sessions/s/events?access_token=t&after=0");
  first.open();
  events.slice(0, 30).forEach((e) => first.send(e));
  first.fail();
  assert.equal(first.readyState, 2, "the failed source is closed, not left to retry by itself");
  assert.deepEqual(statuses, ["connected", "reconnecting"]);
  runTimers();
  const second = FakeSource.all[1];
  assert.equal(second.url, "/v1/sessions/s/events?access_token=t&after=30");
  second.open();
  // A server that resends some of what was seen: only new seqs get through.
  events.slice(25).forEach((e) => second.send(e));
  assert.deepEqual(seen, events.map((e) => e.seq));
  assert.deepEqual(statuses, ["connected", "reconnecting", "connected"]);
});

test("events of the old source after a reconnect are ignored", () => {
  const { stream, seen, runTimers } = harness();
  stream.start(0);
  const first = FakeSource.all[0];
  first.open();
  first.send(events[0]);
  first.fail();
  runTimers();
  first.send(events[1]);
  assert.deepEqual(seen, [1]);
});

test("an event named error is an event, not a connection error", () => {
  const { stream, seen, statuses } = harness();
  stream.start(0);
  const source = FakeSource.all[0];
  source.open();
  source.send({ seq: 1, type: "error", code: "BRAIN_EXITED", message: "gone" });
  assert.deepEqual(seen, [1]);
  assert.deepEqual(statuses, ["connected"]);
  assert.equal(FakeSource.all.length, 1);
});

test("retries back off while the gateway stays away", () => {
  const { stream, timers } = harness();
  stream.start(5);
  const delays = [];
  for (let i = 0; i < 6; i++) {
    FakeSource.all.at(-1).fail();
    delays.push(timers.at(-1).ms);
    timers.splice(0).forEach((t) => t.f());
  }
  assert.deepEqual(delays, [250, 1000, 2000, 5000, 10000, 10000]);
  assert.ok(FakeSource.all.every((s) => s.url.endsWith("after=5")));
});

test("going offline drops the stream and coming back reconnects at once", () => {
  const { stream, statuses } = harness();
  stream.start(0);
  FakeSource.all[0].open();
  FakeSource.all[0].send(events[0]);
  stream.drop();
  assert.deepEqual(statuses, ["connected", "reconnecting"]);
  stream.reconnectNow();
  assert.equal(FakeSource.all.length, 2);
  assert.equal(FakeSource.all[1].url.endsWith("after=1"), true);
});

test("stop closes the source and schedules nothing", () => {
  const { stream, timers } = harness();
  stream.start(0);
  stream.stop();
  assert.equal(FakeSource.all[0].readyState, 2);
  stream.reconnectNow();
  assert.equal(FakeSource.all.length, 1);
  assert.equal(timers.length, 0);
});
