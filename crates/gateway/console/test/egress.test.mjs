// The hands' network in the console (network.md): network requests asked like permissions but
// tied to no turn, refused destinations as quiet lines, allowed ones and byte summaries kept out
// of the chat, and the Network view's words, lists and saves. `egress.jsonl` and
// `egress-get.json` are written by hand in the gateway's shapes (fixtures/README.md).

import { test } from "node:test";
import assert from "node:assert/strict";

import { ApiError, EVENT_TYPES } from "../api.js";
import { applyEvent, createConversation, hostPort, refusedWords } from "../conversation.js";
import { egressOutcomeWords, renderItem } from "../render.js";
import {
  destinationWords,
  egressErrorWords,
  formatBytes,
  networkWords,
  policyWords,
  renderDestinations,
  renderRules,
  seenWords,
  withPolicy,
  withoutRule,
  withRule,
} from "../network.js";
import { findAll, textOf, toDom } from "../vdom.js";
import { buttonLabels, click, fakeDocument, networkHarness, readJson, readJsonl, toHtml } from "./helpers.mjs";

function fold(events) {
  const conversation = createConversation();
  for (const event of events) applyEvent(conversation, event);
  return conversation;
}

const events = readJsonl("egress.jsonl");
const egressGet = readJson("egress-get.json");
const bySeq = (seq) => events.find((e) => e.seq === seq);
const buttons = (node) => findAll(node, (n) => n.tag === "button");
const named = (node) => buttons(node).map((b) => b.attrs["aria-label"] ?? textOf(b));

// ---- the conversation ----

test("the event stream listens for the network events", () => {
  for (const type of ["egress_request", "egress", "credential_used"]) assert.ok(EVENT_TYPES.includes(type), type);
});

test("allowed destinations and byte summaries change nothing in the chat", () => {
  const conversation = fold(events.filter((e) => e.seq <= 3));
  assert.deepEqual(applyEvent(conversation, bySeq(4)), []);
  assert.deepEqual(applyEvent(conversation, bySeq(5)), []);
  assert.equal(conversation.items.length, 2);
});

test("a refused destination is one quiet line per turn", () => {
  const conversation = fold(events);
  const refused = conversation.items.filter((i) => i.kind === "refused");
  assert.deepEqual(refused.map((i) => [i.seq, i.text]), [
    [6, "Refused files.example.com:443 (deny *.example.com)"],
    [22, "Refused files.example.com:443 (deny *.example.com)"],
  ]);
  assert.equal(toHtml(renderItem(refused[0])), '<p class="note refused">Refused files.example.com:443 (deny *.example.com)</p>');
});

test("a refused line without a rule names the destination alone", () => {
  assert.equal(refusedWords({ host: "10.0.0.5", port: 5432 }), "Refused 10.0.0.5:5432");
  assert.equal(refusedWords({ host: "::1", port: 80, rule: "loopback" }), "Refused [::1]:80 (loopback)");
});

test("host:port brackets an IPv6 address", () => {
  assert.equal(hostPort("example.com", 443), "example.com:443");
  assert.equal(hostPort("2001:db8::1", 8080), "[2001:db8::1]:8080");
  assert.equal(hostPort("[2001:db8::1]", 8080), "[2001:db8::1]:8080");
  assert.equal(hostPort("example.com"), "example.com");
});

test("the whole stream gives the items in order", () => {
  const conversation = fold(events);
  assert.deepEqual(
    conversation.items.map((i) => i.kind),
    ["user", "tool", "refused", "egress_request", "permission", "egress_request", "egress_request", "egress_request", "egress_request", "user", "refused"],
  );
});

test("a network request is a card with three buttons, in words for a person", () => {
  const conversation = fold(events.filter((e) => e.seq <= 8));
  const item = conversation.items.at(-1);
  assert.equal(item.kind, "egress_request");
  const node = renderItem(item);
  assert.equal(node.attrs.role, "group");
  assert.equal(node.attrs["aria-label"], "Network permission request");
  assert.match(textOf(node), /The sandbox wants to reach example\.com:443/);
  assert.deepEqual(
    buttons(node).map((b) => [textOf(b), b.attrs["data-request-id"], b.attrs["data-option-id"]]),
    [
      ["Allow once", "egress-1", "allow_once"],
      ["Allow for this session", "egress-1", "allow_session"],
      ["Deny", "egress-1", "deny"],
    ],
  );
  // Every tag and attribute of the card passes vdom's lists.
  const element = toDom(node, fakeDocument);
  assert.deepEqual(element.descendants().filter((e) => e.tagName === "BUTTON").length, 3);
});

test("the end of a turn cancels the agent's request but leaves the network request open", () => {
  const conversation = fold(events.filter((e) => e.seq <= 9));
  const changed = applyEvent(conversation, bySeq(10));
  // The turn's `pip install`, still running when the turn ended, is stopped too.
  assert.deepEqual(changed.map((i) => i.kind), ["tool", "permission"]);
  const permission = conversation.items.find((i) => i.kind === "permission");
  const egress = conversation.items.find((i) => i.kind === "egress_request");
  assert.deepEqual(permission.resolved, { outcome: "cancelled", optionId: null });
  assert.equal(egress.resolved, null);
  assert.equal(buttons(renderItem(egress)).length, 3);
  assert.equal(buttons(renderItem(permission)).length, 0);
});

test("permission_resolved closes a network request after its turn ended", () => {
  const conversation = fold(events.filter((e) => e.seq <= 10));
  const changed = applyEvent(conversation, bySeq(11));
  assert.equal(changed.length, 1);
  assert.equal(changed[0].requestId, "egress-1");
  const node = renderItem(changed[0]);
  assert.equal(buttons(node).length, 0);
  assert.match(textOf(node), /Allowed for this session/);
  assert.equal(node.attrs.class, "permission egress resolved");
});

test("every way a network request ends is said in words", () => {
  const conversation = fold(events);
  const words = conversation.items.filter((i) => i.kind === "egress_request").map((i) => {
    const node = renderItem(i);
    assert.equal(buttons(node).length, 0);
    return [hostPort(i.host, i.port), textOf(findAll(node, (n) => n.attrs.class?.startsWith("answer"))[0])];
  });
  assert.deepEqual(words, [
    ["example.com:443", "Allowed for this session"],
    ["[2001:db8::1]:8080", "Refused: no answer in time"],
    ["api.example.net:443", "Cancelled"],
    ["tracker.example.org:80", "Denied"],
    ["once.example.org:443", "Allowed once"],
  ]);
  assert.equal(egressOutcomeWords({ outcome: "selected", optionId: "something_new" }), "Answered: something_new");
});

test("a replayed network event changes nothing", () => {
  const conversation = fold(events);
  const before = conversation.items.length;
  for (const event of events.slice(-12)) assert.deepEqual(applyEvent(conversation, event), []);
  assert.equal(conversation.items.length, before);
});

// ---- the Network view's words and lists ----

test("byte counts in human units", () => {
  const cases = [[0, "0 B"], [undefined, "0 B"], [999, "999 B"], [1000, "1.0 kB"], [1234, "1.2 kB"], [12345, "12 kB"], [567890, "568 kB"], [999999, "1.0 MB"], [1500000, "1.5 MB"], [3.4e9, "3.4 GB"]];
  for (const [bytes, words] of cases) assert.equal(formatBytes(bytes), words, String(bytes));
});

test("a destination's details in words", () => {
  const [refused, pypi] = egressGet.recent;
  assert.equal(destinationWords(pypi), "policy registries · sent 1.2 kB, received 568 kB · 3 connections");
  assert.equal(destinationWords(refused, Date.parse("2026-12-06T21:08:30Z")), "deny *.example.com · sent 0 B, received 0 B · 1 connection · 5 min ago");
  assert.equal(seenWords("2026-12-06T21:00:00Z", Date.parse("2026-12-06T21:00:20Z")), "just now");
  assert.equal(seenWords("2026-12-06T18:00:00Z", Date.parse("2026-12-06T21:00:00Z")), "3 h ago");
  assert.equal(seenWords(undefined, 0), "");
});

test("the network mode and the policy in words", () => {
  assert.match(networkWords("private"), /^Private network/);
  assert.match(networkWords("host"), /Rules do not apply/);
  assert.match(networkWords("none"), /loopback/);
  assert.equal(policyWords("registries", 60), "Package registries and code hosts pass; any other destination is asked. A question waits 60 s for an answer, then the connection is refused.");
  assert.equal(policyWords("open", 60), "Any public address passes; private and local addresses still need a rule.");
});

test("rules are listed with a Remove button each, only where rules apply", () => {
  const nodes = renderRules("allow", egressGet.allow, true);
  assert.deepEqual(nodes.map((n) => textOf(n.children[0])), ["github.com", "*.example.org:443"]);
  assert.deepEqual(nodes.flatMap(named), ["Remove github.com", "Remove *.example.org:443"]);
  assert.deepEqual(buttons(nodes[0])[0].attrs["data-list"], "allow");
  assert.deepEqual(renderRules("allow", egressGet.allow, false).flatMap(named), []);
  assert.equal(textOf(renderRules("deny", [], true)[0]), "No deny rules.");
  for (const node of nodes) toDom(node, fakeDocument);
});

test("recent destinations say allowed or refused and offer Allow and Deny", () => {
  const nodes = renderDestinations(egressGet.recent, true);
  assert.deepEqual(nodes.map((n) => textOf(n.children[0])), ["files.example.com:443Refused", "pypi.org:443Allowed"]);
  assert.deepEqual(nodes.flatMap(named), ["Allow files.example.com:443", "Deny files.example.com:443", "Allow pypi.org:443", "Deny pypi.org:443"]);
  assert.deepEqual(buttons(nodes[1]).map((b) => [b.attrs["data-action"], b.attrs["data-rule"]]), [["allow", "pypi.org:443"], ["deny", "pypi.org:443"]]);
  for (const node of nodes) toDom(node, fakeDocument);
  assert.equal(textOf(renderDestinations([], true)[0]), "Nothing reached yet.");
});

test("adding a rule takes the same rule out of the other list; nothing twice", () => {
  assert.deepEqual(withRule(egressGet, "allow", "pypi.org:443"), { policy: "registries", allow: ["github.com", "*.example.org:443", "pypi.org:443"], deny: ["*.example.com"] });
  assert.deepEqual(withRule(egressGet, "allow", "*.EXAMPLE.com"), { policy: "registries", allow: ["github.com", "*.example.org:443", "*.EXAMPLE.com"], deny: [] });
  assert.equal(withRule(egressGet, "allow", "GitHub.com"), null);
  assert.deepEqual(withRule(egressGet, "deny", "github.com").allow, ["*.example.org:443"]);
  assert.deepEqual(withoutRule(egressGet, "deny", "*.example.com"), { policy: "registries", allow: ["github.com", "*.example.org:443"], deny: [] });
  assert.equal(withoutRule(egressGet, "deny", "nothing"), null);
  assert.deepEqual(withPolicy(egressGet, "ask"), { policy: "ask", allow: egressGet.allow, deny: egressGet.deny });
  assert.equal(withPolicy(egressGet, "registries"), null);
});

test("a bad rule's message is the gateway's", () => {
  const message = 'bad egress rule "x y": not a host name or IP address';
  assert.equal(egressErrorWords(new ApiError(400, "INVALID_EGRESS_RULE", message)), message);
  assert.equal(egressErrorWords(new ApiError(0, "NETWORK", "the gateway did not answer")), "not saved (the gateway did not answer)");
});

// ---- the Network view against a fake gateway ----

/** A Network view on fake elements and a fake gateway that keeps `egress-get.json`. */
const harness = (options = {}) => networkHarness({ egress: egressGet, ...options });

test("opening the view loads the egress and shows it", async () => {
  const { view, el, requests } = harness();
  await view.show();
  assert.deepEqual(requests.map((r) => `${r.method} ${r.path}`), ["GET /v1/sessions/s1/egress"]);
  assert.match(el.mode.textContent, /^Private network/);
  assert.equal(el.policy.value, "registries");
  assert.equal(el.policy.disabled, false);
  assert.deepEqual(buttonLabels(el.allowList), ["Remove github.com", "Remove *.example.org:443"]);
  assert.deepEqual(buttonLabels(el.recent), ["Allow files.example.com:443", "Deny files.example.com:443", "Allow pypi.org:443", "Deny pypi.org:443"]);
});

test("a refused rule keeps what was typed and says why next to the box", async () => {
  const message = 'bad egress rule "x y": not a host name or IP address';
  const { view, el } = harness({ refuse: (body) => (body.allow.includes("x y") ? new ApiError(400, "INVALID_EGRESS_RULE", message) : null) });
  await view.show();
  el.allowInput.value = "x y";
  await view.addRule("allow");
  assert.equal(el.allowInput.value, "x y");
  assert.equal(el.allowError.textContent, `Not added: ${message}`);
  assert.equal(el.allowError.hidden, false);
  el.allowInput.value = "pypi.org";
  el.allowInput.fire("input");
  assert.equal(el.allowError.hidden, true);
  await view.addRule("allow");
  assert.equal(el.allowInput.value, "");
  assert.deepEqual(buttonLabels(el.allowList), ["Remove github.com", "Remove *.example.org:443", "Remove pypi.org"]);
});

test("quick changes are saved one after the other and none undoes another", async () => {
  const { view, el, requests } = harness();
  await view.show();
  click(el.recent, { action: "allow", rule: "pypi.org:443" });
  click(el.recent, { action: "deny", rule: "files.example.com:443" });
  click(el.allowList, { action: "remove", list: "allow", rule: "github.com" });
  el.policy.value = "ask";
  el.policy.fire("change");
  await view.queue;
  const puts = requests.filter((r) => r.method === "PUT").map((r) => r.body);
  assert.equal(puts.length, 4);
  assert.deepEqual(puts.at(-1), { policy: "ask", allow: ["*.example.org:443", "pypi.org:443"], deny: ["*.example.com", "files.example.com:443"] });
});

test("a network without an egress proxy offers nothing to edit", async () => {
  const { view, el } = harness({ network: "host" });
  await view.show();
  assert.match(el.mode.textContent, /^Host network/);
  assert.equal(el.policy.disabled, true);
  assert.equal(el.allowInput.disabled, true);
  assert.deepEqual(buttonLabels(el.allowList), []);
  assert.deepEqual(buttonLabels(el.recent), []);
});

test("egress events refresh the open view at most once a second", async () => {
  let clock = 1_000_000;
  const pending = [];
  const timers = {
    setTimeout: (f, ms) => pending.push({ f, at: clock + ms }) - 1,
    clearTimeout: (id) => {
      if (pending[id]) pending[id].f = () => {};
    },
  };
  const tick = (ms) => {
    clock += ms;
    for (const timer of pending.filter((t) => t.at <= clock && !t.done)) {
      timer.done = true;
      timer.f();
    }
  };
  const { view, requests } = harness({ timers, now: () => clock });
  await view.show();
  for (let i = 0; i < 5; i++) view.changed();
  assert.equal(pending.length, 1, "one refresh is scheduled for many events");
  tick(999);
  assert.equal(requests.length, 1);
  tick(1);
  await view.queue;
  assert.equal(requests.length, 2);
  view.hide();
  view.changed();
  tick(5000);
  assert.equal(requests.length, 2, "a hidden view waits until it opens");
  await view.show();
  assert.equal(requests.length, 3);
});
