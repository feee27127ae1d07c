// What the Markdown reader makes of agent text, as a table of input → HTML (text escaped).

import { test } from "node:test";
import assert from "node:assert/strict";

import { markdown } from "../markdown.js";
import { toDom } from "../vdom.js";
import { fakeDocument, toHtml } from "./helpers.mjs";

const cases = [
  ["plain text", "hello", "<p>hello</p>"],
  ["a line break stays", "one\ntwo", "<p>one<br>two</p>"],
  ["paragraphs", "one\n\ntwo", "<p>one</p><p>two</p>"],
  ["raw HTML is text", "<img src=x onerror=alert(1)>", "<p>&lt;img src=x onerror=alert(1)&gt;</p>"],
  ["a script tag is text", "<script>alert(1)</script>", "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"],
  ["heading", "# Title", "<h3>Title</h3>"],
  ["bullets", "- one\n- two", "<ul><li>one</li><li>two</li></ul>"],
  ["numbers", "1. one\n2) two", "<ol><li>one</li><li>two</li></ol>"],
  ["a continued item", "- one\n  more", "<ul><li>one<br>more</li></ul>"],
  ["code block", "```js\nlet a = '<b>';\n```", '<pre class="code"><code>let a = \'&lt;b&gt;\';</code></pre>'],
  ["an unterminated code block (still streaming)", "```\nls", '<pre class="code"><code>ls</code></pre>'],
  ["inline code is literal", "run `rm *.txt` now", "<p>run <code>rm *.txt</code> now</p>"],
  ["link", "[docs](https://example.com/a?b=1)", '<p><a href="https://example.com/a?b=1" rel="noopener noreferrer" target="_blank">docs</a></p>'],
  ["a javascript: link stays source text", "[bad](javascript:alert(1))", "<p>[bad](javascript:alert(1))</p>"],
  ["a data: link stays source text", "[x](data:text/html,hi)", "<p>[x](data:text/html,hi)</p>"],
  ["a bare address becomes a link", "see https://x.org/a_b.", '<p>see <a href="https://x.org/a_b" rel="noopener noreferrer" target="_blank">https://x.org/a_b</a>.</p>'],
  ["bold and italic", "**b** and *i*", "<p><strong>b</strong> and <em>i</em></p>"],
  ["shell globs are not italic", "rm *.txt *.md", "<p>rm *.txt *.md</p>"],
  ["escapes", "\\*not italic\\*", "<p>*not italic*</p>"],
  ["quote", "> said", "<blockquote><p>said</p></blockquote>"],
  ["rule", "---", "<hr>"],
];

for (const [name, input, expected] of cases) {
  test(`markdown: ${name}`, () => assert.equal(toHtml(markdown(input)), expected));
}

test("markdown output only ever builds allowed elements", () => {
  const text = cases.map(([, input]) => input).join("\n\n");
  const root = fakeDocument.createElement("div");
  for (const node of markdown(text)) root.appendChild(toDom(node, fakeDocument));
  const tags = new Set(root.descendants().map((e) => e.tagName));
  for (const tag of tags) assert.ok(["P", "BR", "H3", "UL", "OL", "LI", "PRE", "CODE", "A", "STRONG", "EM", "BLOCKQUOTE", "HR"].includes(tag), tag);
  for (const a of root.descendants().filter((e) => e.tagName === "A")) {
    assert.match(a.getAttribute("href"), /^https:\/\//);
    assert.equal(a.getAttribute("rel"), "noopener noreferrer");
  }
});
