// The service worker's notifications (sw.js, phone.md "Push"), run as the browser runs it: the
// file as the gateway serves it (its shell line first) in a context of its own whose `self`,
// registration, clients, fetch and token store are stand-ins. A push payload becomes a
// notification (title, body, tag per session and request, at most two answers, requests that
// stay and say themselves again); an answer's button posts the answer with the device token and
// says how it went; a plain click opens the console at the payload's link; the end of a turn or
// an answer closes the question it makes moot.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import vm from "node:vm";

const source = readFileSync(new URL("../sw.js", import.meta.url), "utf8");
const ORIGIN = "https://warren.example";

/** A fresh worker: its global, and what it did (notifications shown, requests, windows). */
function worker({ token = "wr_token", answer = { status: 204, body: null }, windows = [] } = {}) {
  const handlers = {};
  const shown = [];
  const fetched = [];
  const opened = [];
  const registration = {
    async showNotification(title, options = {}) {
      // The browser replaces a notification of the same tag.
      const index = shown.findIndex((n) => n.open && n.tag === options.tag);
      if (index >= 0) shown[index].open = false;
      shown.push({ title, ...options, open: true, close() { this.open = false; } });
    },
    async getNotifications() {
      return shown.filter((n) => n.open);
    },
  };
  const global = {
    console,
    URL,
    JSON,
    Promise,
    Set,
    registration,
    location: new URL(`${ORIGIN}/sw.js`),
    caches: { open: async () => ({ addAll: async () => {} }), keys: async () => [] },
    clients: {
      async matchAll() {
        return windows;
      },
      async openWindow(url) {
        opened.push(url);
      },
      claim: async () => {},
    },
    async fetch(url, init) {
      fetched.push({ url, ...init, headers: { ...init.headers }, body: init.body && JSON.parse(init.body) });
      if (answer.status === 0) throw new TypeError("Failed to fetch");
      return { status: answer.status, ok: answer.status < 300, json: async () => answer.body };
    },
    addEventListener(type, handler) {
      handlers[type] = handler;
    },
  };
  global.self = global;
  vm.createContext(global);
  vm.runInContext(`const WARREN_SHELL = {"version": "test", "files": ["/"]};\n${source}`, global, { filename: "sw.js" });
  // The page's IndexedDB store, as sw.js reads it.
  global.readToken = async () => token;
  /** Dispatches `event` to the worker's `type` handler and waits for the work it was given. */
  const dispatch = async (type, event) => {
    const work = [];
    handlers[type]({ ...event, waitUntil: (promise) => work.push(promise) });
    await Promise.all(work);
  };
  return { global, shown, fetched, opened, dispatch };
}

const question = {
  session: "s-1",
  title: "Fix the build",
  kind: "permission_request",
  request: "perm-3",
  text: "The agent asks to run: rm doomed.txt",
  url: "/#/s/s-1/r/perm-3",
  actions: [
    { id: "allow", title: "Run it" },
    { id: "reject", title: "Don't run it" },
  ],
};
const push = (payload) => ({ data: { json: () => payload } });

test("a question is shown with its session, its text, one tag per request and its answers; it stays and says itself again", () => {
  const { global } = worker();
  const { title, options } = global.notificationFor(question);
  assert.equal(title, "Fix the build");
  assert.equal(options.body, "The agent asks to run: rm doomed.txt");
  assert.equal(options.tag, "s-1:perm-3");
  assert.deepEqual(JSON.parse(JSON.stringify(options.actions)), [
    { action: "allow", title: "Run it" },
    { action: "reject", title: "Don't run it" },
  ]);
  assert.equal(options.renotify, true);
  assert.equal(options.requireInteraction, true);
  assert.equal(options.data, question);
});

test("more answers than buttons: the first and the last (allow … deny); none where the browser shows none", () => {
  const { global } = worker();
  const egress = {
    ...question,
    kind: "egress_request",
    request: "egress-1",
    actions: [
      { id: "allow_once", title: "Allow once" },
      { id: "allow_session", title: "Allow for this session" },
      { id: "deny", title: "Deny" },
    ],
  };
  // Arrays of the worker's realm, made this one's.
  const actions = (payload, max) => [...global.notificationFor(payload, max).options.actions].map((a) => a.action);
  assert.deepEqual(actions(egress, 2), ["allow_once", "deny"]);
  assert.deepEqual(actions(egress, 3), ["allow_once", "allow_session", "deny"]);
  assert.deepEqual(actions(egress, 1), ["allow_once"]);
  assert.deepEqual(actions(egress, 0), []);
  assert.deepEqual(actions({ ...egress, actions: [{ id: "", title: "x" }, null, { id: "deny", title: "Deny" }] }, 2), ["deny"]);
});

test("what is not a question has no answers, does not insist, and is tagged by its kind", () => {
  const { global } = worker();
  const cases = [
    { session: "s-1", title: "Fix the build", kind: "turn_end", text: "The agent finished.", url: "/#/s/s-1", actions: [] },
    { session: "s-1", title: "", kind: "hands_lost", text: "The sandbox was lost.", url: "/#/s/s-1" },
    // A request kind without a request id cannot be answered from the notification.
    { ...question, request: undefined },
  ];
  const want = [
    ["Fix the build", "s-1:turn_end"],
    ["Warren", "s-1:hands_lost"],
    ["Fix the build", "s-1:permission_request"],
  ];
  cases.forEach((payload, i) => {
    const { title, options } = global.notificationFor(payload);
    assert.deepEqual([title, options.tag], want[i]);
    assert.equal(options.actions.length, 0);
    assert.equal(options.renotify, false);
    assert.equal(options.requireInteraction, false);
  });
});

test("an answer is the permission route with the chosen option; an option not offered is none", () => {
  const { global } = worker();
  assert.deepEqual(JSON.parse(JSON.stringify(global.answerFor(question, "allow"))), {
    method: "POST",
    path: "/v1/sessions/s-1/permissions/perm-3",
    body: { option_id: "allow" },
  });
  assert.equal(global.answerFor({ ...question, session: "a/b", request: "r 1" }, "reject").path, "/v1/sessions/a%2Fb/permissions/r%201");
  assert.equal(global.answerFor(question, "allow_always"), null);
  assert.equal(global.answerFor({ ...question, kind: "turn_end" }, "allow"), null);
  assert.equal(global.answerFor({ ...question, request: "" }, "allow"), null);
});

test("what makes a shown question moot: its answer, the end of its turn, lost hands (not for a network question)", () => {
  const { global } = worker();
  const agent = { session: "s-1", request: "perm-3", kind: "permission_request" };
  const network = { session: "s-1", request: "egress-1", kind: "egress_request" };
  const cases = [
    [{ session: "s-1", kind: "resolved", resolved: "perm-3" }, agent, true],
    [{ session: "s-1", kind: "resolved", resolved: ["x", "egress-1"] }, network, true],
    [{ session: "s-1", kind: "resolved", resolved: "perm-4" }, agent, false],
    [{ session: "s-1", kind: "turn_end" }, agent, true],
    [{ session: "s-1", kind: "hands_lost" }, agent, true],
    [{ session: "s-1", kind: "turn_end" }, network, false],
    [{ session: "s-2", kind: "turn_end" }, agent, false],
    [{ session: "s-1", kind: "turn_end" }, { session: "s-1", kind: "turn_end" }, false],
    [{ session: "s-1", kind: "permission_request", request: "perm-9" }, agent, false],
    [{ session: "s-1", kind: "turn_end" }, null, false],
  ];
  for (const [payload, shown, want] of cases) assert.equal(global.closes(payload, shown), want, JSON.stringify([payload, shown]));
});

test("after an answer the notification says how it went", () => {
  const { global } = worker();
  const cases = [
    [204, "", "Answered: Run it"],
    [0, "NETWORK", /gateway did not answer/],
    [401, "UNAUTHORIZED", /signed out/],
    [404, "PERMISSION_NOT_FOUND", "Already answered, or no longer asked."],
    [404, "SESSION_NOT_FOUND", /session is gone/],
    [500, "INTERNAL", /Not answered \(INTERNAL\)/],
    [502, "", /Not answered \(HTTP 502\)/],
  ];
  for (const [status, code, want] of cases) {
    const text = global.outcomeText(status, code, "Run it");
    if (typeof want === "string") assert.equal(text, want);
    else assert.match(text, want);
  }
});

test("a push shows its notification, and a turn's end closes that turn's open question", async () => {
  const w = worker();
  await w.dispatch("push", push(question));
  assert.deepEqual(
    w.shown.map((n) => [n.title, n.body, n.tag, n.open]),
    [["Fix the build", "The agent asks to run: rm doomed.txt", "s-1:perm-3", true]],
  );
  await w.dispatch("push", push({ session: "s-1", title: "Fix the build", kind: "turn_end", text: "The turn was cancelled.", url: "/#/s/s-1", actions: [] }));
  assert.deepEqual(
    w.shown.map((n) => [n.tag, n.open]),
    [
      ["s-1:perm-3", false],
      ["s-1:turn_end", true],
    ],
  );
  // A resolution alone closes and shows nothing.
  await w.dispatch("push", push(question));
  await w.dispatch("push", push({ session: "s-1", kind: "resolved", resolved: "perm-3" }));
  assert.equal(w.shown.filter((n) => n.open && n.tag === "s-1:perm-3").length, 0);
  // What this console cannot read is still said.
  await w.dispatch("push", { data: { json: () => { throw new SyntaxError("not JSON"); } } });
  await w.dispatch("push", { data: null });
  assert.deepEqual(w.shown.slice(-2).map((n) => [n.title, n.tag]), [["Warren", "warren"], ["Warren", "warren"]]);
});

test("the page's own notification comes as a message with a push's payload and looks the same", async () => {
  const w = worker();
  await w.dispatch("message", { data: { type: "notify", payload: question } });
  assert.deepEqual(w.shown.map((n) => [n.title, n.tag, n.actions.length]), [["Fix the build", "s-1:perm-3", 2]]);
  await w.dispatch("message", { data: { type: "something else" } });
  assert.equal(w.shown.length, 1);
});

const click = (payload, action = "") => {
  const notification = { data: payload, closed: false, close() { this.closed = true; } };
  return { notification, action };
};

test("an answer's button posts the answer with the device token and says it in the same notification", async () => {
  const w = worker();
  const event = click(question, "allow");
  await w.dispatch("notificationclick", event);
  assert.ok(!event.notification.closed, "replaced by the outcome, not closed first");
  assert.deepEqual(w.fetched, [
    {
      url: "/v1/sessions/s-1/permissions/perm-3",
      method: "POST",
      headers: { Authorization: "Bearer wr_token", "Content-Type": "application/json" },
      body: { option_id: "allow" },
    },
  ]);
  assert.deepEqual(
    w.shown.map((n) => [n.title, n.body, n.tag, n.open]),
    [
      ["Fix the build", "Answering: Run it…", "s-1:perm-3", false],
      ["Fix the build", "Answered: Run it", "s-1:perm-3", true],
    ],
  );
  for (const said of w.shown) {
    assert.equal(said.actions, undefined, "an answer asks nothing");
    assert.equal(said.data.request, undefined, "a page that sees the answer leaves it alone");
  }
  assert.equal(w.shown[1].data.url, "/#/s/s-1");
  assert.deepEqual(w.opened, [], "no window opened");
});

test("an answer that cannot be sent says why, and its click leads to the question", async () => {
  const signedOut = worker({ token: null });
  await signedOut.dispatch("notificationclick", click(question, "reject"));
  assert.deepEqual(signedOut.fetched, [], "nothing sent without a token");
  assert.match(signedOut.shown.at(-1).body, /signed out/);

  const answered = worker({ answer: { status: 404, body: { code: "PERMISSION_NOT_FOUND", message: "no such request" } } });
  await answered.dispatch("notificationclick", click(question, "reject"));
  assert.equal(answered.fetched[0].body.option_id, "reject");
  assert.equal(answered.shown.at(-1).body, "Already answered, or no longer asked.");

  const offline = worker({ answer: { status: 0 } });
  await offline.dispatch("notificationclick", click(question, "allow"));
  assert.match(offline.shown.at(-1).body, /did not answer/);
  assert.equal(offline.shown.at(-1).data.url, "/#/s/s-1/r/perm-3");
});

test("a click on the notification itself takes a console window to its link, or opens one", async () => {
  const navigated = [];
  const window = {
    focused: false,
    visibilityState: "hidden",
    focus: async () => {
      throw new Error("not allowed");
    },
    navigate: async (url) => {
      navigated.push(url);
      return window;
    },
  };
  const open = worker({ windows: [window] });
  await open.dispatch("notificationclick", click(question));
  assert.deepEqual(navigated, [`${ORIGIN}/#/s/s-1/r/perm-3`]);
  assert.deepEqual(open.opened, []);
  assert.deepEqual(open.fetched, [], "a click without an answer answers nothing");

  const none = worker();
  const plain = click(question);
  await none.dispatch("notificationclick", plain);
  assert.ok(plain.notification.closed);
  assert.deepEqual(none.opened, [`${ORIGIN}/#/s/s-1/r/perm-3`]);

  // A window this worker does not control cannot be navigated: a new one opens.
  const stranger = worker({ windows: [{ ...window, navigate: async () => { throw new TypeError("not controlled"); } }] });
  await stranger.dispatch("notificationclick", click(question));
  assert.deepEqual(stranger.opened, [`${ORIGIN}/#/s/s-1/r/perm-3`]);

  // A link elsewhere (a payload is data, not trusted to pick an origin) opens the console.
  const elsewhere = worker();
  await elsewhere.dispatch("notificationclick", click({ ...question, url: "https://evil.example/" }));
  await elsewhere.dispatch("notificationclick", click({ ...question, url: "//evil.example/x" }));
  assert.deepEqual(elsewhere.opened, [`${ORIGIN}/`, `${ORIGIN}/`]);

  // An unknown action (not one the payload offered) is a plain click.
  const unknown = worker();
  await unknown.dispatch("notificationclick", click(question, "allow_always"));
  assert.deepEqual(unknown.fetched, []);
  assert.deepEqual(unknown.opened, [`${ORIGIN}/#/s/s-1/r/perm-3`]);
});
