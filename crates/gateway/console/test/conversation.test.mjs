// The conversation rebuilt from recorded event streams: what items a stream gives and how they
// render. `shell-agent.sse` is a real stream of the built-in shell agent; `acp-extras.jsonl`
// holds the ACP updates that agent never sends (fixtures/README.md).

import { test } from "node:test";
import assert from "node:assert/strict";

import { applyEvent, createConversation } from "../conversation.js";
import { renderItem } from "../render.js";
import { findAll, textOf, toDom } from "../vdom.js";
import { fakeDocument, readJsonl, readSse, toHtml } from "./helpers.mjs";

function fold(events) {
  const conversation = createConversation();
  for (const event of events) applyEvent(conversation, event);
  return conversation;
}

const shell = readSse("shell-agent.sse");
const extras = readJsonl("acp-extras.jsonl");

test("the recorded stream is the one the fixture README describes", () => {
  assert.equal(shell.length, 71);
  assert.deepEqual(shell.map((e) => e.seq), Array.from({ length: 71 }, (_, i) => i + 1));
});

test("agent text streamed in chunks is joined into one message", () => {
  const conversation = fold(shell);
  const agent = conversation.items.filter((item) => item.kind === "agent").map((item) => item.text);
  assert.deepEqual(agent, [
    "hi\n",
    "<img src=x onerror=alert(1)>",
    "Not run: permission to run `rm -f nothing` was refused.\n",
    "# Title\n\n- one\n- two\n\n`code` and [link](https://example.com) and [bad](javascript:alert(1))\n\n```\nfn main() {}\n```\n",
    "[command ended with exit code 1]\n",
    "part1 part2 part3 done\n",
  ]);
});

test("a chunk arriving while the tool call is updated keeps the message open", () => {
  const conversation = createConversation();
  const turn = shell.filter((e) => e.turn === 9);
  const changed = turn.map((event) => applyEvent(conversation, event).map((item) => item.kind));
  assert.deepEqual(changed, [["user"], [], ["tool"], ["tool"], ["agent"], ["agent"], ["agent"], ["agent"], ["tool"], []]);
});

test("the img tag an agent printed is text and creates no element", () => {
  const conversation = fold(shell);
  const item = conversation.items.find((i) => i.kind === "agent" && i.text.includes("<img"));
  const node = renderItem(item);
  // A command's output: terminal text (output.js), the tag in it as text.
  const pre = findAll(node, (n) => n.tag === "pre")[0];
  assert.equal(toHtml(pre), '<pre class="term-text msg agent">&lt;img src=x onerror=alert(1)&gt;</pre>');
  const element = toDom(node, fakeDocument);
  assert.deepEqual(element.descendants().map((e) => e.tagName), ["DIV", "BUTTON", "PRE"]);
  assert.equal(element.descendants().at(-1).textContent, "<img src=x onerror=alert(1)>");
});

test("a permission request shows one button per option, named by the option's name", () => {
  const conversation = createConversation();
  for (const event of shell.filter((e) => e.seq <= 21)) applyEvent(conversation, event);
  const item = conversation.items.at(-1);
  assert.equal(item.kind, "permission");
  const node = renderItem(item);
  assert.equal(node.attrs.role, "group");
  assert.equal(node.attrs["aria-label"], "Permission request");
  const buttons = findAll(node, (n) => n.tag === "button");
  assert.deepEqual(
    buttons.map((b) => [textOf(b), b.attrs["data-request-id"], b.attrs["data-option-id"]]),
    [
      ["Run it", "perm-e353b1ce7d28444c8f70f20392295ce0", "allow"],
      ["Don't run it", "perm-e353b1ce7d28444c8f70f20392295ce0", "reject"],
    ],
  );
  assert.match(textOf(node), /rm x/);
});

test("an answered permission request shows the answer and no buttons", () => {
  const conversation = fold(shell);
  const [allowed, refused] = conversation.items.filter((i) => i.kind === "permission");
  for (const [item, answer] of [[allowed, "Answered: Run it"], [refused, "Answered: Don't run it"]]) {
    const node = renderItem(item);
    assert.equal(findAll(node, (n) => n.tag === "button").length, 0);
    assert.match(textOf(node), new RegExp(answer));
  }
});

test("a cancelled turn says cancelled", () => {
  const conversation = fold(shell);
  const sleep = conversation.items.find((i) => i.kind === "tool" && i.title === "sleep 30");
  assert.equal(sleep.status, "failed");
  const next = conversation.items[conversation.items.indexOf(sleep) + 1];
  assert.deepEqual([next.kind, next.text], ["note", "cancelled"]);
  assert.equal(toHtml(renderItem(next)), '<p class="note cancelled">cancelled</p>');
});

test("a replayed seq changes nothing and renders no duplicate", () => {
  const conversation = fold(shell);
  const before = conversation.items.length;
  const texts = conversation.items.map((i) => i.text);
  // A resume that overlaps: the last ten events again, then nothing new.
  for (const event of shell.slice(-10)) assert.deepEqual(applyEvent(conversation, event), []);
  assert.equal(conversation.items.length, before);
  assert.deepEqual(conversation.items.map((i) => i.text), texts);
});

test("tool calls carry title, kind, status and a non-zero exit code", () => {
  const conversation = fold(shell);
  const rows = conversation.items.filter((i) => i.kind === "tool").map((i) => textOf(renderItem(i).children[0]));
  assert.deepEqual(rows.slice(0, 2), ["execute echo hi done", "execute touch x done"]);
  assert.equal(rows.at(-2), "execute false failed (exit 1)");
});

test("hands and status changes are quiet lines", () => {
  const conversation = fold(shell.slice(0, 5));
  assert.deepEqual(
    conversation.items.filter((i) => i.kind === "note").map((i) => i.text),
    ["hands starting (bwrap)", "hands running (bwrap, 96 ms)", "agent ready"],
  );
});

test("the running state follows turn_start and turn_end", () => {
  const conversation = createConversation();
  const states = shell.filter((e) => e.turn === 6).map((event) => (applyEvent(conversation, event), conversation.running));
  assert.deepEqual(states, [false, true, true, true, true, false]);
});

test("thoughts are joined and folded", () => {
  const conversation = fold(extras);
  const thought = conversation.items.find((i) => i.kind === "thought");
  assert.equal(toHtml(renderItem(thought)), '<details class="thought"><summary>Thought</summary><p class="plain">The greeting is in src/main.rs.</p></details>');
});

test("a plan update replaces the plan in place", () => {
  const conversation = fold(extras);
  const plans = conversation.items.filter((i) => i.kind === "plan");
  assert.equal(plans.length, 1);
  assert.equal(
    toHtml(renderItem(plans[0])),
    '<div class="plan"><p class="label">Plan</p><ol><li class="plan-completed"><span aria-hidden="true">●</span> Find the greeting</li><li class="plan-completed"><span aria-hidden="true">●</span> Change it</li></ol></div>',
  );
});

test("ACP diff content is shown as a unified diff", () => {
  const conversation = fold(extras);
  const tool = conversation.items.find((i) => i.kind === "tool");
  const node = renderItem(tool);
  const diffs = findAll(node, (n) => n.tag === "pre" && n.attrs.class === "diff");
  assert.equal(diffs.length, 2);
  assert.equal(
    textOf(diffs[0]),
    ["--- a/src/main.rs", "+++ b/src/main.rs", "@@ -1,3 +1,3 @@", " fn main() {", '-    println!("hello");', '+    println!("hello, world");', " }", ""].join("\n"),
  );
  assert.deepEqual(diffs[0].children.map((line) => line.attrs.class), ["file", "file", "hunk", "ctx", "del", "add", "ctx"]);
  assert.equal(textOf(diffs[1]), "--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+# Notes\n");
  assert.equal(diffs[1].attrs["aria-label"], "Changes to NOTES.md");
  assert.ok(textOf(node).includes("2 files changed"));
  assert.ok(textOf(node).startsWith("edit Edit src/main.rs done"));
});

test("errors are plain text", () => {
  const conversation = fold(extras);
  const error = conversation.items.find((i) => i.kind === "error");
  assert.equal(toHtml(renderItem(error)), '<p class="error"><strong>Error</strong> the agent exited with status 3 &lt;b&gt;bold?&lt;/b&gt; (BRAIN_EXITED)</p>');
});

test("an interrupted turn and a gap are said in words", () => {
  const conversation = fold(extras);
  const notes = conversation.items.filter((i) => i.kind === "note").map((i) => i.text);
  assert.deepEqual(notes, ["interrupted (the gateway restarted or its storage failed)", "Earlier events were compacted: 12–20 are not shown."]);
  assert.equal(conversation.lastSeq, 20);
});

test("a request still open when its turn ends can no longer be answered", () => {
  const conversation = createConversation();
  for (const event of shell.filter((e) => e.seq <= 21)) applyEvent(conversation, event);
  const changed = applyEvent(conversation, { seq: 22, type: "turn_end", turn: 3, stop_reason: "interrupted" });
  const permission = changed.find((i) => i.kind === "permission");
  assert.equal(findAll(renderItem(permission), (n) => n.tag === "button").length, 0);
});
