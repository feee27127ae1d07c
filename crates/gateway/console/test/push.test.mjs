// The page's side of notifications (push.js), its pure parts: the gateway's key as bytes, the
// payload a live event makes (the same shape as the gateway's pushes, so the service worker
// shows both alike), and the Notifications switch in words, which must say truthfully where it
// stands.

import { test } from "node:test";
import assert from "node:assert/strict";

import { base64UrlBytes, payloadForEvent, sameBytes, switchWords } from "../push.js";
import { readJsonl, readSse } from "./helpers.mjs";

test("the gateway's key is base64url, without padding", () => {
  assert.deepEqual([...base64UrlBytes("AQID")], [1, 2, 3]);
  assert.deepEqual([...base64UrlBytes("-_8")], [251, 255]);
  assert.deepEqual([...base64UrlBytes("AQ")], [1]);
  // An uncompressed P-256 point: 65 bytes, the first 4.
  const point = "BEl62iUYgUivxIkv69yViEuiBIa-Ib9-SkvMeAtA3LFgDzkrxZJjSgSnfckjBJuBkr3qBUYIHBQFLXYp5Nksh8U";
  const bytes = base64UrlBytes(point);
  assert.equal(bytes.length, 65);
  assert.equal(bytes[0], 4);
});

test("two keys are the same when their bytes are", () => {
  const a = new Uint8Array([4, 1, 2]);
  assert.ok(sameBytes(a, new Uint8Array([4, 1, 2]).buffer));
  assert.ok(sameBytes(a.buffer, a));
  assert.ok(!sameBytes(a, new Uint8Array([4, 1, 3])));
  assert.ok(!sameBytes(a, new Uint8Array([4, 1])));
  assert.ok(!sameBytes(a, null));
});

const session = { id: "s-1", title: "Fix the build" };

test("a permission request is a question with the agent's options as answers, at its deep link", () => {
  const event = {
    type: "permission_request",
    seq: 9,
    request_id: "perm-3",
    tool_call: { toolCallId: "cmd-1", title: "rm doomed.txt" },
    options: [
      { optionId: "allow", name: "Run it", kind: "allow_once" },
      { optionId: "reject", name: "Don't run it", kind: "reject_once" },
    ],
  };
  assert.deepEqual(payloadForEvent(event, session), {
    session: "s-1",
    title: "Fix the build",
    kind: "permission_request",
    request: "perm-3",
    text: "The agent asks to run: rm doomed.txt",
    actions: [
      { id: "allow", title: "Run it" },
      { id: "reject", title: "Don't run it" },
    ],
    url: "/#/s/s-1/r/perm-3",
  });
  const edit = { ...event, tool_call: { title: "Edit src/main.rs", kind: "edit" } };
  assert.equal(payloadForEvent(edit, session).text, "The agent asks to use: Edit src/main.rs");
});

test("a network request names the destination and offers the network's answers", () => {
  const event = { type: "egress_request", request_id: "egress-1", host: "pypi.org", port: 443, options: ["allow_once", "allow_session", "deny"] };
  const payload = payloadForEvent(event, session);
  assert.equal(payload.kind, "egress_request");
  assert.equal(payload.request, "egress-1");
  assert.equal(payload.url, "/#/s/s-1/r/egress-1");
  assert.match(payload.text, /^The sandbox wants to reach pypi\.org/);
  assert.deepEqual(payload.actions, [
    { id: "allow_once", title: "Allow once" },
    { id: "allow_session", title: "Allow for this session" },
    { id: "deny", title: "Deny" },
  ]);
});

test("a finished turn, a cancelled one and lost hands are said; nothing else is", () => {
  assert.deepEqual(payloadForEvent({ type: "turn_end", stop_reason: "end_turn" }, session), {
    session: "s-1",
    title: "Fix the build",
    url: "/#/s/s-1",
    kind: "turn_end",
    text: "The agent finished.",
    actions: [],
  });
  assert.equal(payloadForEvent({ type: "turn_end", stop_reason: "cancelled" }, session).text, "The turn was cancelled.");
  assert.equal(payloadForEvent({ type: "hands", state: "lost" }, session).kind, "hands_lost");
  assert.equal(payloadForEvent({ type: "hands", state: "lost" }, session).text, "The sandbox was lost; the next use starts it again on the same workspace.");
  assert.equal(payloadForEvent({ type: "hands", state: "lost", error: "the host went away" }, session).text, "The sandbox was lost: the host went away");
  assert.equal(payloadForEvent({ type: "permission_request", request_id: "r", tool_call: { title: " " }, options: [] }, session).text, "The agent asks to run: a tool");
  for (const event of [{ type: "hands", state: "running" }, { type: "update" }, { type: "user_message", text: "hi" }, { type: "permission_resolved", request_id: "x" }]) {
    assert.equal(payloadForEvent(event, session), null, event.type);
  }
  // An untitled session is named by its id.
  assert.equal(payloadForEvent({ type: "turn_end" }, { id: "0123456789abcdef" }).title, "Session 01234567");
});

test("every event of the recorded sessions maps to a payload the worker can show, or to none", () => {
  const events = [...readSse("shell-agent.sse"), ...readJsonl("egress.jsonl")];
  const kinds = new Set();
  for (const event of events) {
    const payload = payloadForEvent(event, session);
    if (payload === null) continue;
    kinds.add(payload.kind);
    assert.equal(typeof payload.text, "string");
    assert.ok(payload.url.startsWith("/#/s/s-1"), payload.url);
    if (payload.request) assert.ok(payload.actions.length > 0 && payload.actions.every((a) => a.id && a.title), JSON.stringify(event));
  }
  assert.deepEqual([...kinds].sort(), ["egress_request", "permission_request", "turn_end"]);
});

test("the switch says where it stands", () => {
  const cases = [
    [{ supported: false, permission: "default", subscribed: false }, false, true, /Not available in this browser/],
    [{ supported: true, permission: "denied", subscribed: false }, false, true, /Blocked by the browser/],
    [{ supported: true, permission: "default", subscribed: false }, false, false, /^Off/],
    [{ supported: true, permission: "granted", subscribed: true }, true, false, /^On/],
    [{ supported: true, permission: "granted", subscribed: false, busy: true }, false, true, /Turning on/],
    [{ supported: true, permission: "granted", subscribed: true, busy: true }, true, true, /Turning off/],
    [{ supported: true, permission: "granted", subscribed: false, error: "Not turned on: the browser refused (x)" }, false, false, /^Not turned on/],
  ];
  for (const [state, checked, disabled, text] of cases) {
    const words = switchWords(state);
    assert.equal(words.checked, checked, JSON.stringify(state));
    assert.equal(words.disabled, disabled, JSON.stringify(state));
    assert.match(words.text, text);
  }
});
