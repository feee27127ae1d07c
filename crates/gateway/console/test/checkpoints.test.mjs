// Checkpoints in the console: a turn's `checkpoint` event as its "N files changed" line (placed at
// the end of its turn, replayed without a duplicate), a fork's first line, a checkpoint's changes
// as the diff view shows them, the list's pages, and the words of rewinding and forking.

import { test } from "node:test";
import assert from "node:assert/strict";

import { ApiError, EVENT_TYPES } from "../api.js";
import {
  MAX_DIFF_LINES,
  checkpointMeta,
  checkpointName,
  diffFiles,
  diffSummary,
  firstPage,
  forkErrorWords,
  forkTitle,
  hunkLines,
  reasonWords,
  renderChangedFile,
  renderCheckpoint,
  renderDiff,
  rewindErrorWords,
  rewindParagraphs,
  timeWords,
  withNewest,
  withOlder,
} from "../checkpoints.js";
import { applyEvent, createConversation } from "../conversation.js";
import { renderItem } from "../render.js";
import { findAll, textOf, toDom } from "../vdom.js";
import { fakeDocument, readSse, toHtml } from "./helpers.mjs";

const shell = readSse("shell-agent.sse");

function fold(events) {
  const conversation = createConversation();
  for (const event of events) applyEvent(conversation, event);
  return conversation;
}

/** A `checkpoint` event as the gateway sends it. */
const checkpoint = (seq, turn, id, filesChanged, reason = "turn") => ({
  seq, ts: "2026-12-01T20:25:14.400Z", turn, type: "checkpoint", id, files_changed: filesChanged, bytes_new: 120, elapsed_ms: 40, reason,
});

// The shell agent's first three turns (echo hi; touch x; rm x), with a checkpoint after each
// turn that used the sandbox: turn 1 changed nothing, turn 2 made x, turn 3's checkpoint comes
// once the fourth turn has begun.
const turns = shell.filter((event) => event.seq <= 17);
const turn3 = shell.filter((event) => event.turn === 3);
const turn4 = shell.filter((event) => event.turn === 4);
// (Seqs between two of the recording's: the order is what matters.)
const events = [
  ...turns.slice(0, 10),
  checkpoint(10.5, 1, "ck-1", 0),
  ...turns.slice(10),
  checkpoint(17.5, 2, "ck-2", 1),
  ...turn3,
  ...turn4.slice(0, 3),
  checkpoint(turn4[2].seq + 0.5, 3, "ck-3", 1),
  ...turn4.slice(3),
];

const lines = (conversation) => conversation.items.filter((item) => item.kind === "checkpoint");

test("EventSource is told the checkpoint, forked and rewound event types", () => {
  for (const type of ["checkpoint", "forked", "rewound"]) assert.ok(EVENT_TYPES.includes(type), type);
});

test("a turn's checkpoint is its 'N files changed' line; none when no file changed", () => {
  const conversation = fold(events);
  assert.deepEqual(
    lines(conversation).map(({ checkpointId, turn, filesChanged }) => [checkpointId, turn, filesChanged]),
    [["ck-2", 2, 1], ["ck-3", 3, 1]],
  );
  const node = renderItem(lines(conversation)[0]);
  assert.equal(
    toHtml(node),
    '<p class="checkpoint-line"><button type="button" class="small checkpoint-changes" data-checkpoint="ck-2" title="Show the changes of this checkpoint">1 file changed</button></p>',
  );
  const many = renderItem({ ...lines(conversation)[0], filesChanged: 12 });
  assert.equal(textOf(many), "12 files changed");
});

test("the line comes right after its turn's last item, even when the next turn has begun", () => {
  const conversation = fold(events);
  assert.equal(conversation.lastSeq, turn4.at(-1).seq, "every event applied");
  const order = conversation.items.map((item) => `${item.kind}:${item.turn}`);
  const at = order.indexOf("checkpoint:3");
  assert.equal(order[at - 1].endsWith(":3"), true, order.join(" "));
  assert.equal(order[at + 1], "user:4", order.join(" "));
  // Placed among the items: the view inserts it before the next turn's first item.
  const line = lines(conversation)[1];
  assert.equal(line.before, conversation.items[at + 1].id);
  assert.equal(lines(conversation)[0].before, undefined, "one on time is simply appended");
});

test("a late checkpoint does not split the agent message streaming meanwhile", () => {
  const conversation = createConversation();
  const output = (seq, text) => ({ seq, turn: 5, type: "update", update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text } } });
  for (const event of [{ seq: 1, turn: 4, type: "turn_end" }, { seq: 2, turn: 5, type: "user_message", text: "say" }, output(3, "one "), checkpoint(4, 4, "ck-4", 2), output(5, "two")]) {
    applyEvent(conversation, event);
  }
  assert.deepEqual(conversation.items.map((item) => item.kind), ["checkpoint", "user", "agent"]);
  assert.equal(conversation.items.at(-1).text, "one two");
});

test("replayed after a reconnect or reload (`after=`), the events make the same lines once", () => {
  const conversation = fold(events);
  const before = lines(conversation).map((item) => item.checkpointId);
  for (const event of events) assert.deepEqual(applyEvent(conversation, event), []);
  assert.deepEqual(lines(conversation).map((item) => item.checkpointId), before);
  // A page reloaded: the whole stream again, into a new conversation, gives the same lines.
  assert.deepEqual(lines(fold(events)).map((item) => [item.checkpointId, item.turn]), lines(conversation).map((item) => [item.checkpointId, item.turn]));
});

test("a checkpoint of another reason says it; a fork's first makes no line", () => {
  const reasons = ["rewind", "pause", "fork"].flatMap((reason, n) => [checkpoint(2 * n + 1, 3, `ck-${reason}-0`, 0, reason), checkpoint(2 * n + 2, 3, `ck-${reason}`, 2, reason)]);
  assert.deepEqual(lines(fold(reasons)).map((item) => textOf(renderItem(item))), ["Before the rewind · 2 files changed", "Sandbox paused · 2 files changed"]);
});

test("a rewind is a quiet line naming the checkpoint by its turn, and saying the state before was kept", () => {
  const rewound = (seq, checkpoint) => ({ seq, turn: 3, type: "rewound", checkpoint, saved: "ck-9", restart: false });
  const conversation = fold([checkpoint(1, 1, "ck-1", 2), checkpoint(2, 2, "ck-2", 0), checkpoint(3, 3, "ck-9", 1, "rewind"), rewound(4, "ck-1"), rewound(5, "ck-2"), rewound(6, "ck_aaaaaaaaaaaaaaaa")]);
  const said = conversation.items.filter((item) => item.kind === "rewound").map((item) => textOf(renderItem(item)));
  assert.deepEqual(said, [
    "Workspace rewound to turn 1; what it held before is kept as a checkpoint.",
    "Workspace rewound to turn 2; what it held before is kept as a checkpoint.",
    // One whose checkpoint event this stream no longer holds (compacted): its id.
    "Workspace rewound to checkpoint ck_aaaaaaaaa…; what it held before is kept as a checkpoint.",
  ]);
  const restarted = conversation.items.find((item) => item.kind === "rewound");
  assert.match(textOf(renderItem({ ...restarted, restart: true })), /The agent was restarted\.$/);
});

test("a fork's first line names its source session (a link) and checkpoint", () => {
  const conversation = fold([{ seq: 1, ts: "2026-12-01T20:30:00Z", type: "forked", source_session: "5f0c2d1e-aaaa-bbbb", checkpoint: "ck_0123456789abcdef" }]);
  const [item] = conversation.items;
  assert.deepEqual([item.kind, item.sourceSession, item.checkpointId], ["forked", "5f0c2d1e-aaaa-bbbb", "ck_0123456789abcdef"]);
  const titled = renderItem(item, { sessionTitle: (id) => (id === "5f0c2d1e-aaaa-bbbb" ? "Build <the> app" : null) });
  assert.equal(
    toHtml(titled),
    '<p class="note forked">Forked from <a href="/#/s/5f0c2d1e-aaaa-bbbb" data-session="5f0c2d1e-aaaa-bbbb">Build &lt;the&gt; app</a> at checkpoint <code title="ck_0123456789abcdef">ck_012345678…</code></p>',
  );
  // A source this device does not list (deleted, say): its id's start.
  assert.equal(textOf(renderItem(item)), "Forked from session 5f0c2d1e at checkpoint ck_012345678…");
  assert.doesNotThrow(() => toDom(titled, fakeDocument));
  // The gateway may name them as objects.
  const [object] = fold([{ seq: 1, type: "forked", source_session: { id: "s-1" }, checkpoint: { id: "c-1" } }]).items;
  assert.deepEqual([object.sourceSession, object.checkpointId], ["s-1", "c-1"]);
});

// ---- a checkpoint's changes ----

const diff = {
  added: [{ path: "src/new.rs", size: 120 }],
  removed: [{ path: "old.txt", size: 2048 }],
  modified: [
    { path: "README.md", old_size: 10, new_size: 12, binary: false, diff: "--- a/README.md\n+++ b/README.md\n@@ -1,2 +1,2 @@\n # Title\n--- old rule\n+new line\n" },
    { path: "logo.png", old_size: 2048, new_size: 4096, binary: true, diff: null },
    { path: "data.csv", old_size: 2_000_000, new_size: 2_100_000, binary: false, diff: null },
  ],
};

test("the changed files are listed by path, each with its status", () => {
  assert.deepEqual(diffFiles(diff).map((file) => `${file.status} ${file.path}`), ["modified README.md", "modified data.csv", "modified logo.png", "removed old.txt", "added src/new.rs"]);
  assert.equal(diffSummary(diff), "5 files changed: 1 added, 3 modified, 1 removed");
  assert.equal(diffSummary({ added: [{ path: "a", size: 1 }] }), "1 file changed: 1 added");
  assert.equal(diffSummary({ added: [], removed: [], modified: [] }), "No file changed since the checkpoint before.");
  assert.equal(toHtml(renderDiff({})), '<div class="cp-diff"><p class="cp-summary">No file changed since the checkpoint before.</p></div>');
});

test("a modified text file shows its hunks, coloured by line; the path header is said once above", () => {
  const [readme] = diffFiles(diff);
  const node = renderChangedFile(readme);
  const [pre] = findAll(node, (n) => n.tag === "pre");
  assert.deepEqual(
    pre.children.map((span) => [span.attrs.class, textOf(span)]),
    [["hunk", "@@ -1,2 +1,2 @@\n"], ["ctx", " # Title\n"], ["del", "--- old rule\n"], ["add", "+new line\n"]],
  );
  assert.equal(pre.attrs["aria-label"], "Changes to README.md");
  assert.equal(textOf(findAll(node, (n) => n.attrs.class === "cp-stat meta")[0]), "+1 −1");
  assert.deepEqual(hunkLines("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n"), ["@@ -1 +1 @@", "-a", "+b", "\\ No newline at end of file"]);
});

test("a folder added or removed is said by its files, not as a file of its own", () => {
  const folders = {
    added: [{ path: "app", size: 0 }, { path: "app/src", size: 0 }, { path: "app/src/main.rs", size: 9 }, { path: "empty", size: 0, type: "dir" }, { path: "apple", size: 3 }],
    removed: [{ path: "gone", size: 0 }, { path: "gone/x", size: 1 }],
  };
  assert.deepEqual(diffFiles(folders).map((file) => `${file.status} ${file.path}`), ["added app/src/main.rs", "added apple", "removed gone/x"]);
  assert.equal(diffSummary(folders), "3 files changed: 2 added, 1 removed");
});

test("a binary file shows its sizes and no diff; a text file too large for one says so", () => {
  const files = diffFiles(diff);
  const binary = renderChangedFile(files.find((file) => file.path === "logo.png"));
  assert.equal(findAll(binary, (n) => n.tag === "pre").length, 0);
  assert.match(textOf(binary), /binary, 2\.0 KB → 4\.0 KB/);
  const large = renderChangedFile(files.find((file) => file.path === "data.csv"));
  assert.equal(findAll(large, (n) => n.tag === "pre").length, 0);
  assert.match(textOf(large), /1\.9 MB → 2\.0 MB/);
  assert.match(textOf(large), /Too large to show the changes/);
});

test("added and removed files show their size; every file there is at the checkpoint can be viewed", () => {
  const files = diffFiles(diff);
  const view = (node) => findAll(node, (n) => n.tag === "button").map((button) => [button.attrs["data-action"], button.attrs["data-path"], button.attrs["aria-label"]]);
  const added = renderChangedFile(files.find((file) => file.status === "added"));
  assert.equal(toHtml(findAll(added, (n) => n.attrs.class === "cp-file-name")[0]), '<p class="cp-file-name"><span class="cp-status">Added</span><code class="cp-path">src/new.rs</code><span class="cp-stat meta">120 B</span></p>');
  assert.deepEqual(view(added), [["view", "src/new.rs", "View src/new.rs"]]);
  const removed = renderChangedFile(files.find((file) => file.status === "removed"));
  assert.match(textOf(removed), /Removedold\.txt2\.0 KB/);
  assert.deepEqual(view(removed), [], "a removed file is not at the checkpoint");
  assert.deepEqual(view(renderChangedFile(files[0])), [["view", "README.md", "View README.md"]]);
  const link = renderChangedFile(diffFiles({ added: [{ path: "latest", size: 9, type: "symlink" }] })[0]);
  assert.deepEqual(view(link), [], "a link is not a file to view");
  assert.match(textOf(link), /Addedlatestlink/);
});

test("a very long diff is cut, and the lines left out are counted", () => {
  const body = Array.from({ length: MAX_DIFF_LINES + 500 }, (_, n) => `+line ${n}`).join("\n");
  const node = renderChangedFile({ status: "modified", path: "big.txt", oldSize: 0, newSize: 1, binary: false, diff: `@@ -0,0 +1,${MAX_DIFF_LINES + 499} @@\n${body}\n` });
  assert.equal(findAll(node, (n) => n.tag === "pre")[0].children.length, MAX_DIFF_LINES);
  assert.match(textOf(node), /501 more lines not shown\./);
});

test("a modified file whose text is the same (mode or time) says so", () => {
  const node = renderChangedFile({ status: "modified", path: "run.sh", oldSize: 5, newSize: 5, binary: false, diff: "" });
  assert.match(textOf(node), /Its text is the same/);
});

test("file names and diff text are only ever text", () => {
  const node = renderDiff({ added: [{ path: "<img src=x onerror=alert(1)>.txt", size: 1 }], modified: [{ path: "a", old_size: 1, new_size: 1, binary: false, diff: "@@ -1 +1 @@\n-<b>\n+<script>x</script>\n" }] });
  const element = toDom(node, fakeDocument);
  assert.deepEqual([...new Set(element.descendants().map((e) => e.tagName))].sort(), ["BUTTON", "CODE", "DIV", "LI", "P", "PRE", "SPAN", "UL"]);
  assert.match(element.textContent, /<script>x<\/script>/);
});

// ---- the list's pages ----

const cp = (id, turn = 1) => ({ id, turn, created_at: "2026-12-01T20:25:14Z", files: 3, bytes: 100, files_changed: 1, reason: "turn" });
const ids = (list) => list.items.map((item) => item.id).join(",");

test("More adds the next page below; a checkpoint listed already is not listed twice", () => {
  let list = firstPage({ checkpoints: [cp("c9"), cp("c8")], next: "c7" });
  assert.deepEqual([ids(list), list.next], ["c9,c8", "c7"]);
  list = withOlder(list, { checkpoints: [cp("c8"), cp("c7"), cp("c6")], next: "c5" });
  assert.deepEqual([ids(list), list.next], ["c9,c8,c7,c6", "c5"]);
  list = withOlder(list, { checkpoints: [cp("c5")], next: null });
  assert.deepEqual([ids(list), list.next], ["c9,c8,c7,c6,c5", null]);
  assert.deepEqual(firstPage(null), { items: [], next: null });
});

test("the newest page again goes on top of the pages loaded, or replaces them after a gap", () => {
  const loaded = { items: [cp("c9"), cp("c8"), cp("c7"), cp("c6")], next: "c5" };
  // Two new ones: the page (c11, c10, c9) reaches the list; c8 and older stay, More still works.
  const merged = withNewest(loaded, { checkpoints: [cp("c11"), cp("c10"), cp("c9")], next: "c8" });
  assert.deepEqual([ids(merged), merged.next], ["c11,c10,c9,c8,c7,c6", "c5"]);
  // A collected one (c10) goes: the page is what the gateway has now.
  const collected = withNewest(merged, { checkpoints: [cp("c11"), cp("c9"), cp("c8")], next: "c7" });
  assert.deepEqual([ids(collected), collected.next], ["c11,c9,c8,c7,c6", "c5"]);
  // More new ones than a page holds: the page alone, More from there.
  const gap = withNewest(loaded, { checkpoints: [cp("c15"), cp("c14")], next: "c13" });
  assert.deepEqual([ids(gap), gap.next], ["c15,c14", "c13"]);
  // A page that is the whole list, the first load, an empty session.
  assert.deepEqual(ids(withNewest(loaded, { checkpoints: [cp("c10"), cp("c9")], next: null })), "c10,c9");
  assert.deepEqual(ids(withNewest(null, { checkpoints: [cp("c1")], next: null })), "c1");
  assert.deepEqual(withNewest(loaded, { checkpoints: [], next: null }), { items: [], next: null });
});

// ---- words ----

test("a checkpoint in words: its turn, why it was taken, its sizes", () => {
  assert.equal(checkpointName({ turn: 3 }), "turn 3");
  assert.equal(checkpointName({ turn: 0 }), "before the first turn");
  assert.deepEqual(["turn", "rewind", "pause", "files", "fork", "other"].map(reasonWords), ["after the turn", "before a rewind", "sandbox paused", "your file changes", "the fork's start", "other"]);
  assert.equal(checkpointMeta({ files: 12, bytes: 4200, files_changed: 3 }), "12 files, 4.1 KB · 3 changed");
  assert.equal(checkpointMeta({ files: 1, bytes: 5, files_changed: 0 }), "1 file, 5 B · nothing changed");
  assert.equal(checkpointMeta({ files: 2, bytes: 5, files_changed: 1, changed_under: ["log.bin"] }), "2 files, 5 B · 1 changed · log.bin was being written as it was taken");
  assert.equal(checkpointMeta({ files: 2, bytes: 5, files_changed: 2, changed_under: ["a", "b"] }), "2 files, 5 B · 2 changed · 2 files were being written as it was taken");
});

test("a checkpoint of today shows its time; an older one its day too", () => {
  const now = Date.parse("2026-12-01T18:00:00");
  const today = timeWords("2026-12-01T09:05:00", now);
  assert.equal(today, new Date("2026-12-01T09:05:00").toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }));
  const older = timeWords("2026-11-28T09:05:00", now);
  assert.ok(older.endsWith(today) && older.length > today.length, older);
  assert.equal(timeWords("not a time", now), "");
});

test("the list's entry: turn, reason, time, sizes, and its four actions", () => {
  const node = renderCheckpoint({ ...cp("ck-7", 4), reason: "rewind" }, Date.parse("2026-12-01T22:00:00Z"));
  const head = textOf(findAll(node, (n) => n.attrs.class === "checkpoint-head")[0]);
  assert.ok(head.startsWith("Turn 4before a rewind"), head);
  assert.deepEqual(
    findAll(node, (n) => n.tag === "button").map((b) => [textOf(b), b.attrs["data-action"], b.attrs["data-checkpoint"]]),
    [["Diff", "diff", "ck-7"], ["Browse files", "files", "ck-7"], ["Rewind", "rewind", "ck-7"], ["Fork", "fork", "ck-7"]],
  );
  assert.equal(findAll(renderCheckpoint(cp("ck-8")), (n) => n.attrs.class === "checkpoint-reason").length, 0, "a turn's own needs no reason");
  assert.equal(findAll(node, (n) => n.tag === "a").length, 0, "no download link without its URL");
  const link = findAll(renderCheckpoint(cp("ck-9", 5), 0, "/v1/sessions/s/checkpoints/ck-9/export?access_token=t"), (n) => n.tag === "a");
  assert.deepEqual(
    link.map((a) => [textOf(a), a.attrs.href, a.attrs.download, a.attrs["aria-label"]]),
    [["Download", "/v1/sessions/s/checkpoints/ck-9/export?access_token=t", "", "Download the files of turn 5"]],
  );
});

test("the rewind asks first, saying what happens to the workspace and that the current state is kept", () => {
  const words = rewindParagraphs({ ...cp("c", 2) }).join(" ");
  assert.match(words, /The workspace becomes what it was at this checkpoint \(turn 2, /);
  assert.match(words, /current state is kept as a checkpoint first/);
  assert.equal(rewindErrorWords(new ApiError(409, "TURN_RUNNING", "a turn is running")), "The agent is working on a turn: wait until it ends (or Cancel it in the Chat), then rewind.");
  assert.match(rewindErrorWords(new ApiError(404, "CHECKPOINT_NOT_FOUND", "no")), /no longer exists/);
  assert.match(rewindErrorWords(new ApiError(409, "CHECKPOINT_BROKEN", "chunk x")), /damaged .*nothing was changed/);
  assert.equal(rewindErrorWords(new ApiError(0, "NETWORK", "the gateway did not answer")), "Not rewound: the gateway did not answer");
});

test("a fork is offered a title made of the session's and the checkpoint's, within 200 characters", () => {
  assert.equal(forkTitle("Build the app", cp("c", 3)), "Build the app (turn 3)");
  const long = forkTitle("x".repeat(300), cp("c", 12));
  assert.equal(long.length, 200);
  assert.ok(long.endsWith(" (turn 12)"));
  assert.match(forkErrorWords(new ApiError(429, "QUOTA_EXCEEDED", "")), /as many sessions as it may/);
  assert.equal(forkErrorWords(new ApiError(500, "INTERNAL", "boom")), "Not forked: boom");
});
