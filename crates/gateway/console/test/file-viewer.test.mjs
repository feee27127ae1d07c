// The file viewer's decisions (file-viewer.js): text or binary, how much is shown and said,
// which language colours a name, and highlight.js's HTML read back into lines of spans (with
// the vendored highlight.js itself, so an update that changes its output shape is caught).

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import {
  HIGHLIGHT_MAX_BYTES,
  LANGUAGES,
  VIEW_MAX_BYTES,
  decodeText,
  highlightedLines,
  highlighter,
  languageOf,
  parseHighlighted,
  planNote,
  textLines,
  viewerPlan,
} from "../file-viewer.js";

const utf8 = (text) => new TextEncoder().encode(text);

const languages = [
  ["main.py", "python"], ["src/lib.rs", "rust"], ["app.ts", "typescript"], ["a.JS", "javascript"],
  ["go.mod", null], ["main.go", "go"], ["run.sh", "bash"], ["Cargo.toml", "ini"], ["config.yml", "yaml"],
  ["data.json", "json"], ["README.md", "markdown"], ["index.html", "xml"], ["style.css", "css"],
  ["x.c", "c"], ["x.hpp", "cpp"], ["Main.java", "java"], ["fix.patch", "diff"], ["q.sql", "sql"],
  ["Dockerfile", "dockerfile"], ["Dockerfile.dev", "dockerfile"], ["Makefile", "makefile"], [".bashrc", "bash"],
  ["notes.txt", null], [".gitignore", null], ["LICENSE", null], ["archive.tar.gz", null], ["", null],
];
for (const [name, language] of languages) {
  test(`language of ${JSON.stringify(name)}`, () => assert.equal(languageOf(name), language));
}

test("every language a name leads to is vendored", () => {
  for (const language of LANGUAGES) {
    const file = new URL(`../vendor/highlight/languages/${language}.min.js`, import.meta.url);
    assert.ok(readFileSync(file).length > 0, language);
  }
});

test("text, binary and empty files", () => {
  assert.deepEqual(viewerPlan({ name: "a.bin", bytes: new Uint8Array([0x7f, 0x45, 0x4c, 0x46, 0, 1]), totalBytes: 6 }), { kind: "binary", totalBytes: 6 });
  assert.deepEqual(viewerPlan({ name: "latin1.txt", bytes: new Uint8Array([0x63, 0x61, 0x66, 0xe9]), totalBytes: 4 }), { kind: "binary", totalBytes: 4 });
  assert.deepEqual(viewerPlan({ name: "e.txt", bytes: new Uint8Array(0), totalBytes: 0 }), { kind: "empty" });
  assert.deepEqual(viewerPlan({ name: "a.py", bytes: utf8("print('é')\n"), totalBytes: 12 }), {
    kind: "text", text: "print('é')\n", truncated: false, totalBytes: 12, shownBytes: 12, language: "python", highlight: true,
  });
});

test("a file past the limit shows its start, a character cut at the limit left out", () => {
  const total = VIEW_MAX_BYTES + 5000;
  const bytes = new Uint8Array(VIEW_MAX_BYTES).fill(0x61);
  bytes.set(utf8("é").subarray(0, 1), VIEW_MAX_BYTES - 1); // the first byte of a two-byte character
  const plan = viewerPlan({ name: "big.log", bytes, totalBytes: total });
  assert.equal(plan.kind, "text");
  assert.equal(plan.truncated, true);
  assert.equal(plan.text.length, VIEW_MAX_BYTES - 1);
  assert.equal(planNote(plan), "Showing the first 1.0 MiB of 1.0 MiB: download it for the rest.");
  // Bytes beyond the limit (a server that ignored the range) are not shown either.
  const whole = viewerPlan({ name: "big.txt", bytes: new Uint8Array(VIEW_MAX_BYTES + 10).fill(0x62), totalBytes: VIEW_MAX_BYTES + 10 });
  assert.equal(whole.shownBytes, VIEW_MAX_BYTES);
  assert.equal(whole.truncated, true);
  // Invalid UTF-8 that is not at the cut is binary still.
  assert.equal(decodeText(new Uint8Array([0xff, 0x61]), { cut: true }), null);
});

test("colours up to HIGHLIGHT_MAX_BYTES, plain text past it", () => {
  const at = viewerPlan({ name: "a.rs", bytes: new Uint8Array(HIGHLIGHT_MAX_BYTES).fill(0x61), totalBytes: HIGHLIGHT_MAX_BYTES });
  assert.equal(at.highlight, true);
  const past = viewerPlan({ name: "a.rs", bytes: new Uint8Array(HIGHLIGHT_MAX_BYTES + 1).fill(0x61), totalBytes: HIGHLIGHT_MAX_BYTES + 1 });
  assert.equal(past.highlight, false);
  assert.equal(planNote(past), "No colours past 256.0 KiB.");
  assert.equal(viewerPlan({ name: "a.txt", bytes: utf8("x"), totalBytes: 1 }).highlight, false);
});

test("the notes", () => {
  assert.equal(planNote({ kind: "binary", totalBytes: 123456 }), "Binary file, 123,456 bytes: download it to open it.");
  assert.equal(planNote({ kind: "empty" }), "Empty file.");
  assert.equal(planNote(viewerPlan({ name: "a.py", bytes: utf8("x\n"), totalBytes: 2 })), "");
  assert.equal(planNote(viewerPlan({ name: "a.py", bytes: utf8("x"), totalBytes: 3 * 1024 * 1024 })), "Showing the first 1 byte of 3.0 MiB: download it for the rest.");
});

test("lines: a final newline ends the last line, CRLF is a line break", () => {
  assert.deepEqual(textLines("a\nb\n"), ["a", "b"]);
  assert.deepEqual(textLines("a\r\nb"), ["a", "b"]);
  assert.deepEqual(textLines("\n\n"), ["", ""]);
  assert.deepEqual(textLines("x"), ["x"]);
  assert.deepEqual(textLines(""), [""]);
});

test("only highlight.js's own HTML is read back", () => {
  assert.deepEqual(parseHighlighted('<span class="hljs-keyword">fn</span> a &lt; b &amp;&amp; c &quot;&#x27;'), [
    { open: ["hljs-keyword"] }, { text: "fn" }, { close: true }, { text: " a < b && c \"'" },
  ]);
  for (const bad of ["<b>x</b>", '<span class="x" onclick="y">z</span>', '<span class="a">open', "</span>", "&nbsp;", '<img src=x onerror="alert(1)">', '<span class="a"><script>']) {
    assert.equal(parseHighlighted(bad), null, bad);
  }
});

test("a span across lines is closed and opened again on each line", () => {
  const lines = highlightedLines('<span class="hljs-comment">/* one\ntwo */</span>\n<span class="hljs-keyword">fn</span> <span class="hljs-title function_">main</span>() {}\n');
  assert.deepEqual(lines, [
    [{ classes: ["hljs-comment"], children: ["/* one"] }],
    [{ classes: ["hljs-comment"], children: ["two */"] }],
    [{ classes: ["hljs-keyword"], children: ["fn"] }, " ", { classes: ["hljs-title", "function_"], children: ["main"] }, "() {}"],
  ]);
});

const textOf = (nodes) => nodes.map((node) => (typeof node === "string" ? node : textOf(node.children))).join("");

test("the vendored highlight.js colours Python and Rust, and its lines are the text's lines", async () => {
  const samples = {
    python: 'def greet(name):\n    """Say hello."""\n    return f"hello {name}"  # a < b\n\nprint(greet("x"))\n',
    rust: '/// Docs\nfn main() {\n    let s = "multi\nline";\n    println!("{s}");\n}\n',
  };
  for (const [language, text] of Object.entries(samples)) {
    const hljs = await highlighter(language);
    const lines = highlightedLines(hljs.highlight(text, { language, ignoreIllegals: true }).value);
    assert.ok(lines, `${language}: highlight.js's HTML is of the known shape`);
    assert.deepEqual(lines.map(textOf), textLines(text), language);
    const classes = new Set(JSON.stringify(lines).match(/hljs-[a-z_]+/g));
    assert.ok(classes.has("hljs-keyword") && classes.has("hljs-string"), `${language}: ${[...classes]}`);
  }
});
