// Unified diffs as `diff -u` prints them (the expected texts were checked against GNU diff).

import { test } from "node:test";
import assert from "node:assert/strict";

import { diffLineClasses, unifiedDiff } from "../diff.js";

const lines = (n, change = {}) => Array.from({ length: n }, (_, i) => change[i + 1] ?? `line ${i + 1}`).join("\n") + "\n";

const cases = [
  ["one changed line", "a\nb\nc\n", "a\nB\nc\n", ["@@ -1,3 +1,3 @@", " a", "-b", "+B", " c"]],
  ["a new file", null, "one\ntwo\n", ["@@ -0,0 +1,2 @@", "+one", "+two"]],
  ["a file emptied", "one\n", "", ["@@ -1 +0,0 @@", "-one"]],
  ["no change", "same\n", "same\n", []],
  [
    "two distant changes make two hunks",
    lines(12),
    lines(12, { 2: "two", 11: "eleven" }),
    ["@@ -1,5 +1,5 @@", " line 1", "-line 2", "+two", " line 3", " line 4", " line 5", "@@ -8,5 +8,5 @@", " line 8", " line 9", " line 10", "-line 11", "+eleven", " line 12"],
  ],
  ["a line added at the end", "x\ny\n", "x\ny\nz\n", ["@@ -1,2 +1,3 @@", " x", " y", "+z"]],
];

for (const [name, oldText, newText, hunks] of cases) {
  test(`unified diff: ${name}`, () => {
    const out = unifiedDiff("f.txt", oldText, newText);
    assert.deepEqual(out.slice(0, 2), [oldText === null ? "--- /dev/null" : "--- a/f.txt", "+++ b/f.txt"]);
    assert.deepEqual(out.slice(2), hunks);
  });
}

test("diff lines are classed by where they are: headers before the hunks, + and - inside them", () => {
  const lines = ["diff --git a/x b/x", "--- a/x", "+++ b/x", "@@ -1,3 +1,3 @@", " same", "--- a rule", "+++ a heading", "\\ No newline at end of file", "diff --git a/y b/y", "--- a/y"];
  assert.deepEqual(diffLineClasses(lines), ["file", "file", "file", "hunk", "ctx", "del", "add", "hunk", "file", "file"]);
  assert.deepEqual(diffLineClasses([]), []);
});
