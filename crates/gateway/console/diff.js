// Unified diffs of ACP `diff` tool-call content (`{path, oldText, newText}`; `oldText` null for a
// new file): a line diff by longest common subsequence, then hunks with three lines of context,
// as `diff -u` prints them. Texts too large for the quadratic table are shown as one hunk that
// removes every old line and adds every new one, which is still correct, only less tidy.
// `diffLineClasses` says how each line of a unified diff (made here or by the gateway) looks.

const CONTEXT_LINES = 3;
const MAX_TABLE_CELLS = 4_000_000;

function splitLines(text) {
  if (text === null || text === undefined || text === "") return [];
  const lines = text.split("\n");
  if (lines.at(-1) === "") lines.pop();
  return lines;
}

/** Line operations turning `a` into `b`: `[{op: " " | "-" | "+", line}]`. */
export function diffLines(a, b) {
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const ops = a.slice(0, start).map((line) => ({ op: " ", line }));
  const midA = a.slice(start, endA);
  const midB = b.slice(start, endB);
  const n = midA.length;
  const m = midB.length;
  if (n * m > MAX_TABLE_CELLS) {
    ops.push(...midA.map((line) => ({ op: "-", line })), ...midB.map((line) => ({ op: "+", line })));
  } else {
    // lcs[i][j]: the length of the longest common subsequence of midA[i..] and midB[j..].
    const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i][j] = midA[i] === midB[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && midA[i] === midB[j]) {
        ops.push({ op: " ", line: midA[i++] });
        j++;
      } else if (i < n && (j === m || lcs[i + 1][j] >= lcs[i][j + 1])) {
        ops.push({ op: "-", line: midA[i++] });
      } else {
        ops.push({ op: "+", line: midB[j++] });
      }
    }
  }
  ops.push(...a.slice(endA).map((line) => ({ op: " ", line })));
  return ops;
}

// diff -u leaves out a count of one.
function span(start, count) {
  return count === 1 ? `${start}` : `${start},${count}`;
}

/** The lines of a unified diff of `path` from `oldText` to `newText` (headers, hunks). */
export function unifiedDiff(path, oldText, newText) {
  const isNew = oldText === null || oldText === undefined;
  const ops = diffLines(splitLines(oldText), splitLines(newText));
  const lines = [isNew ? "--- /dev/null" : `--- a/${path}`, `+++ b/${path}`];
  const changed = ops.map((o, index) => (o.op === " " ? -1 : index)).filter((index) => index >= 0);
  if (changed.length === 0) return lines;
  // Group the changed operations into hunks whose context windows touch or overlap.
  const ranges = [];
  for (const index of changed) {
    const from = Math.max(0, index - CONTEXT_LINES);
    const to = Math.min(ops.length, index + CONTEXT_LINES + 1);
    const last = ranges.at(-1);
    if (last && from <= last.to) last.to = Math.max(last.to, to);
    else ranges.push({ from, to });
  }
  // Line numbers (1-based) in the old and new text where each operation sits.
  let oldLine = 1;
  let newLine = 1;
  const positions = ops.map((o) => {
    const at = { oldLine, newLine };
    if (o.op !== "+") oldLine++;
    if (o.op !== "-") newLine++;
    return at;
  });
  for (const { from, to } of ranges) {
    const slice = ops.slice(from, to);
    const oldCount = slice.filter((o) => o.op !== "+").length;
    const newCount = slice.filter((o) => o.op !== "-").length;
    // diff -u numbers an empty side by the line before it.
    const oldStart = oldCount === 0 ? positions[from].oldLine - 1 : positions[from].oldLine;
    const newStart = newCount === 0 ? positions[from].newLine - 1 : positions[from].newLine;
    lines.push(`@@ -${span(oldStart, oldCount)} +${span(newStart, newCount)} @@`);
    for (const o of slice) lines.push(o.op + o.line);
  }
  return lines;
}

/** The class of each line of a unified diff: "file" (a header before the hunks), "hunk" (an `@@`
 *  line, or a `\ No newline at end of file` remark), "add", "del" or "ctx". Inside a hunk a line
 *  is what its first character says, so a removed line reading `-- x` is no header. */
export function diffLineClasses(lines) {
  let inHunk = false;
  return lines.map((line) => {
    if (line.startsWith("@@")) {
      inHunk = true;
      return "hunk";
    }
    if (line.startsWith("diff ")) inHunk = false;
    if (!inHunk) return "file";
    if (line.startsWith("+")) return "add";
    if (line.startsWith("-")) return "del";
    if (line.startsWith("\\")) return "hunk";
    return "ctx";
  });
}
