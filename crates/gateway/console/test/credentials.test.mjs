// Credentials at the edge in the console (network.md): each request the egress proxy set a
// credential on is a quiet line in the chat, the same request again folds into it with a count,
// and the Network view's Credentials section lists what the session's device may use with an
// on/off switch, saved as one `PUT /egress` that keeps the policy and rules. `credentials.jsonl`
// and `egress-get.json` are written by hand in the gateway's shapes (fixtures/README.md).

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { ApiError } from "../api.js";
import { applyEvent, createConversation } from "../conversation.js";
import { credentialWords, renderItem } from "../render.js";
import { credentialsOn, egressErrorWords, renderCredentials, withCredential, withPolicy, withRule } from "../network.js";
import { findAll, textOf, toDom } from "../vdom.js";
import { buttonLabels, click, fakeDocument, networkHarness, readJson, readJsonl, toHtml } from "./helpers.mjs";

function fold(events) {
  const conversation = createConversation();
  for (const event of events) applyEvent(conversation, event);
  return conversation;
}

const events = readJsonl("credentials.jsonl");
const egressGet = readJson("egress-get.json");
const bySeq = (seq) => events.find((e) => e.seq === seq);
const uses = (conversation) => conversation.items.filter((i) => i.kind === "credential");
const buttons = (node) => findAll(node, (n) => n.tag === "button");

// ---- the chat ----

test("a credential use is one quiet line: the name, the request and its status", () => {
  const conversation = fold(events.filter((e) => e.seq <= 11));
  const item = conversation.items.at(-1);
  assert.equal(item.kind, "credential");
  assert.equal(credentialWords(item), "github · POST api.github.com/repos/o/r/pulls → 201");
  assert.equal(
    toHtml(renderItem(item)),
    '<p class="note credential" title="github · POST api.github.com/repos/o/r/pulls → 201">' +
      '<span class="credential-key" aria-hidden="true">🔑</span> <span class="credential-name">github</span> · ' +
      '<span class="credential-method">POST</span> <span class="credential-target">api.github.com/repos/o/r/pulls</span>' +
      ' → <span class="credential-status">201</span></p>',
  );
  assert.equal(textOf(renderItem(item)), "🔑 github · POST api.github.com/repos/o/r/pulls → 201");
  toDom(renderItem(item), fakeDocument);
});

test("the same request again folds into the line before with a count", () => {
  const conversation = fold(events.filter((e) => e.seq <= 4));
  const [line] = uses(conversation);
  const changed = applyEvent(conversation, bySeq(5));
  assert.deepEqual(changed, [line], "the line is changed, not a new one added");
  assert.equal(line.count, 2);
  const node = renderItem(line);
  assert.equal(textOf(node), "🔑 github · GET github.com/o/r.git/info/refs → 200 ×2");
  assert.equal(node.attrs.title, "github · GET github.com/o/r.git/info/refs → 200 ×2");
  assert.equal(findAll(node, (n) => n.attrs.class === "credential-count").length, 1);
});

test("a git push and a pull request fold into lines by request and status", () => {
  const conversation = fold(events);
  assert.deepEqual(
    conversation.items.map((i) => i.kind),
    ["user", "tool", "credential", "credential", "agent", "credential", "credential", "credential", "credential", "credential", "credential"],
  );
  assert.deepEqual(
    uses(conversation).map((i) => [i.seq, credentialWords(i)]),
    [
      // A byte summary and a tool's update between two uses add no line, so they still fold.
      [4, "github · GET github.com/o/r.git/info/refs → 200 ×2"],
      [7, "github · POST github.com/o/r.git/git-receive-pack → 200 ×2"],
      [11, "github · POST api.github.com/repos/o/r/pulls → 201"],
      // Another status is another line; the same request after a different one is too.
      [12, "github · POST api.github.com/repos/o/r/pulls → 422 ×2"],
      [14, "github · GET api.github.com/repos/o/r/pulls → 200"],
      [15, "github · POST api.github.com/repos/o/r/pulls → 422"],
      [17, "npm · GET registry.npmjs.org/-/whoami → 401"],
      [18, "github · GET api.github.com/repos/o/r/contents/src/gateway/console/components/network/credentials/switch-and-list.test.mjs → 200"],
    ],
  );
});

test("a use with status 400 and up is styled as a failure", () => {
  const classes = uses(fold(events)).map((i) => [i.status, renderItem(i).attrs.class]);
  assert.deepEqual(classes, [
    [200, "note credential"],
    [200, "note credential"],
    [201, "note credential"],
    [422, "note credential failed"],
    [200, "note credential"],
    [422, "note credential failed"],
    [401, "note credential failed"],
    [200, "note credential"],
  ]);
});

test("a long path fits a phone's line: it is the part that gives way, and the title has it all", () => {
  const long = uses(fold(events)).at(-1);
  const node = renderItem(long);
  const target = findAll(node, (n) => n.attrs.class === "credential-target")[0];
  assert.equal(textOf(target), "api.github.com/repos/o/r/contents/src/gateway/console/components/network/credentials/switch-and-list.test.mjs");
  assert.equal(node.attrs.title, credentialWords(long));
  // The stylesheet keeps the line on one line and ellipsizes only the host and path.
  const css = readFileSync(new URL("../app.css", import.meta.url), "utf8");
  assert.match(css, /\.note\.credential \{[^}]*white-space: nowrap;[^}]*overflow: hidden;/);
  assert.match(css, /\.note\.credential > \.credential-target \{[^}]*min-width: 0;[^}]*text-overflow: ellipsis;/);
});

test("a query never shows, and a use without a status has no arrow", () => {
  const conversation = createConversation();
  const [item] = applyEvent(conversation, { seq: 1, type: "credential_used", name: "gl", host: "gitlab.com", method: "GET", path: "/api/v4/user?private_token=x" });
  assert.equal(credentialWords(item), "gl · GET gitlab.com/api/v4/user");
  assert.equal(renderItem(item).attrs.class, "note credential");
});

test("a replayed credential event changes nothing", () => {
  const conversation = fold(events);
  const counts = uses(conversation).map((i) => i.count);
  for (const event of events) assert.deepEqual(applyEvent(conversation, event), []);
  assert.deepEqual(uses(conversation).map((i) => i.count), counts);
});

// ---- the Network view's Credentials section ----

const switches = (nodes) => nodes.flatMap((n) => buttons(n));
const sectionText = (nodes) => nodes.map(textOf).join("\n");

test("the Credentials section lists each credential with its hosts, header and an on/off switch", () => {
  const nodes = renderCredentials(egressGet);
  assert.match(textOf(nodes[0]), /values never enter the sandbox/);
  const items = findAll(nodes[1], (n) => n.tag === "li");
  assert.deepEqual(items.map((li) => li.attrs.class), ["credential-item credential-on", "credential-item"]);
  assert.deepEqual(items.map((li) => textOf(findAll(li, (n) => n.attrs.class === "meta credential-where")[0])), [
    "sets Authorization on github.com, api.github.com",
    "sets Authorization on registry.npmjs.org",
  ]);
  assert.deepEqual(
    switches(nodes).map((b) => [b.attrs["aria-label"], b.attrs.role, b.attrs["aria-checked"], b.attrs["data-credential"], textOf(b), b.attrs.disabled]),
    [
      ["Use github", "switch", "true", "github", "On", false],
      ["Use npm", "switch", "false", "npm", "Off", false],
    ],
  );
  // Every tag and attribute passes vdom's lists.
  for (const node of nodes) toDom(node, fakeDocument);
});

test("a switch saving is disabled and says where it is going; a refusal is said under it", () => {
  const nodes = renderCredentials(egressGet, new Map([["npm", true]]), new Map([["github", "Not turned off: no"]]));
  assert.deepEqual(switches(nodes).map((b) => [textOf(b), b.attrs.disabled, b.attrs["aria-checked"]]), [
    ["On", false, "true"],
    ["Turning on…", true, "false"],
  ]);
  const errors = findAll(nodes[1], (n) => n.attrs.class === "error");
  assert.deepEqual(errors.map((e) => [textOf(e), e.attrs.role]), [["Not turned off: no", "alert"]]);
});

test("with no credential offered, the section says how to add one", () => {
  const nodes = renderCredentials({ ...egressGet, credentials: [], available_credentials: [] });
  assert.equal(nodes.length, 1);
  assert.match(sectionText(nodes), /warren serve --hands-credential NAME=HOST:HEADER:VALUE/);
  assert.match(sectionText(nodes), /never enters the sandbox/);
  assert.deepEqual(switches(nodes), []);
});

test("without an egress proxy the section says credentials need --hands-network private", () => {
  for (const network of ["host", "none", "remote"]) {
    const empty = renderCredentials({ ...egressGet, network, credentials: [], available_credentials: [] });
    assert.match(sectionText(empty), /--hands-network private/, network);
    assert.doesNotMatch(sectionText(empty), /--hands-credential/, network);
    const offered = renderCredentials({ ...egressGet, network });
    assert.match(sectionText(offered), /--hands-network private/, network);
    assert.deepEqual(switches(offered), [], `${network}: nothing to switch`);
    assert.deepEqual(findAll(offered[1], (n) => n.tag === "li").map(textOf), ["githubonsets Authorization on github.com, api.github.com", "npmoffsets Authorization on registry.npmjs.org"]);
  }
});

test("turning a credential on or off keeps the policy and rules and sends the credentials on", () => {
  const kept = { policy: "registries", allow: ["github.com", "*.example.org:443"], deny: ["*.example.com"] };
  assert.deepEqual(withCredential(egressGet, "npm", true), { ...kept, credentials: ["github", "npm"] });
  assert.deepEqual(withCredential(egressGet, "github", false), { ...kept, credentials: [] });
  assert.equal(withCredential(egressGet, "github", true), null, "already on");
  assert.equal(withCredential(egressGet, "npm", false), null, "already off");
  assert.equal(withCredential(egressGet, "gitlab", true), null, "not offered");
  // Offered order, and a name on but no longer offered is not sent back (it would be refused).
  assert.deepEqual(withCredential({ ...egressGet, credentials: ["npm", "gone"] }, "github", true).credentials, ["github", "npm"]);
  // The policy and rule changes leave `credentials` out: unchanged.
  assert.equal("credentials" in withRule(egressGet, "allow", "pypi.org"), false);
  assert.equal("credentials" in withPolicy(egressGet, "ask"), false);
});

test("which credentials are on: the credentials list, or each one's enabled", () => {
  assert.deepEqual(credentialsOn(egressGet), ["github"]);
  assert.deepEqual(credentialsOn({ credentials: [{ name: "a" }, "b", {}] }), ["a", "b"]);
  const { credentials, ...older } = egressGet;
  assert.deepEqual(credentialsOn(older), ["github"]);
  assert.deepEqual(credentialsOn(null), []);
});

test("a credential the gateway does not offer: its message is the gateway's", () => {
  const message = "no credential named npm is offered to this session";
  assert.equal(egressErrorWords(new ApiError(400, "UNKNOWN_CREDENTIAL", message)), message);
});

// ---- the switch against a fake gateway ----

const switchOf = (el, name) =>
  el.credentials.children.flatMap((n) => [n, ...n.descendants()]).find((e) => e.tagName === "BUTTON" && e.getAttribute("data-credential") === name);
const errorsIn = (el) => el.credentials.children.flatMap((n) => [n, ...n.descendants()]).filter((e) => e.getAttribute("class") === "error").map((e) => e.textContent);

test("a switch PUTs the egress with the policy and rules unchanged and the new credentials, disabled meanwhile", async () => {
  const { view, el, requests } = networkHarness({ egress: egressGet });
  await view.show();
  assert.deepEqual(buttonLabels(el.credentials), ["Use github", "Use npm"]);
  click(el.credentials, { credential: "npm" });
  // Disabled from the tap until the answer.
  assert.equal(switchOf(el, "npm").getAttribute("disabled"), "");
  assert.equal(switchOf(el, "npm").textContent, "Turning on…");
  assert.equal(switchOf(el, "github").getAttribute("disabled"), null);
  click(el.credentials, { credential: "npm" }); // a second tap while saving does nothing
  await view.queue;
  const puts = requests.filter((r) => r.method === "PUT");
  assert.deepEqual(puts, [
    { method: "PUT", path: "/v1/sessions/s1/egress", body: { policy: "registries", allow: ["github.com", "*.example.org:443"], deny: ["*.example.com"], credentials: ["github", "npm"] } },
  ]);
  assert.equal(switchOf(el, "npm").getAttribute("disabled"), null);
  assert.equal(switchOf(el, "npm").getAttribute("aria-checked"), "true");
  assert.equal(switchOf(el, "npm").textContent, "On");

  click(el.credentials, { credential: "github" });
  await view.queue;
  assert.deepEqual(requests.at(-1).body.credentials, ["npm"]);
  assert.equal(switchOf(el, "github").getAttribute("aria-checked"), "false");
});

test("a switch and a rule saved one after the other keep each other's change", async () => {
  const { view, el, requests } = networkHarness({ egress: egressGet });
  await view.show();
  click(el.credentials, { credential: "npm" });
  click(el.allowList, { action: "remove", list: "allow", rule: "github.com" });
  await view.queue;
  const puts = requests.filter((r) => r.method === "PUT").map((r) => r.body);
  assert.deepEqual(puts[1], { policy: "registries", allow: ["*.example.org:443"], deny: ["*.example.com"] });
  assert.equal(switchOf(el, "npm").getAttribute("aria-checked"), "true");
  assert.deepEqual(buttonLabels(el.allowList), ["Remove *.example.org:443"]);
});

test("a refused switch says why under the credential and loads the settings again", async () => {
  const { view, el, requests, api } = networkHarness({ egress: egressGet });
  await view.show();
  // The gateway restarted without npm; the view still offers it.
  api.set({ available_credentials: [egressGet.available_credentials[0]] });
  assert.equal(await view.toggleCredential("npm"), false);
  await view.queue;
  assert.deepEqual(requests.map((r) => r.method), ["GET", "PUT", "GET"]);
  // The list is the gateway's again, and what happened is still said.
  assert.deepEqual(buttonLabels(el.credentials), ["Use github"]);
  assert.deepEqual(errorsIn(el), ["Not turned on: no credential named npm is offered to this session"]);
});

test("a refusal under a credential still offered stays beside its switch, enabled again", async () => {
  const { view, el } = networkHarness({ egress: egressGet, refuse: (body) => (body.credentials?.includes("npm") ? new ApiError(400, "UNKNOWN_CREDENTIAL", "npm is not for this device") : null) });
  await view.show();
  await view.toggleCredential("npm");
  await view.queue;
  const npm = el.credentials.children[1].descendants().filter((e) => e.tagName === "LI")[1];
  assert.deepEqual(npm.descendants().filter((e) => e.getAttribute("class") === "error").map((e) => e.textContent), ["Not turned on: npm is not for this device"]);
  assert.equal(switchOf(el, "npm").getAttribute("disabled"), null);
  assert.equal(switchOf(el, "npm").getAttribute("aria-checked"), "false");
});

test("a 409 (no egress proxy) is shown under the switch; the next tap clears it", async () => {
  let refuse = true;
  const { view, el } = networkHarness({
    egress: egressGet,
    refuse: () => (refuse ? new ApiError(409, "NO_EGRESS_PROXY", "this session's network has no egress proxy") : null),
  });
  await view.show();
  click(el.credentials, { credential: "github" });
  await view.queue;
  assert.deepEqual(errorsIn(el), ["Not turned off: this session's network has no egress proxy"]);
  assert.equal(switchOf(el, "github").getAttribute("aria-checked"), "true");
  refuse = false;
  click(el.credentials, { credential: "github" });
  assert.deepEqual(errorsIn(el), []);
  await view.queue;
  assert.equal(switchOf(el, "github").getAttribute("aria-checked"), "false");
});

test("a network without an egress proxy shows the credentials with nothing to switch", async () => {
  const { view, el } = networkHarness({ egress: egressGet, network: "host" });
  await view.show();
  assert.deepEqual(buttonLabels(el.credentials), []);
  assert.match(el.credentials.children[0].textContent, /--hands-network private/);
});

test("another session shown while a switch saves is left alone", async () => {
  const { view, el } = networkHarness({ egress: egressGet });
  await view.show();
  const saving = view.toggleCredential("npm");
  view.setSession("s2");
  await saving;
  assert.equal(view.credentialSaves.size, 0);
  assert.deepEqual(el.credentials.children, []);
});
