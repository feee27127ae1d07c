// Command output as terminal text: ANSI escapes → styled runs (ansi.js), the output block with
// its fold and Copy button (output.js), and which agent text is a command's output
// (conversation.js `outputOf`) in the recorded shell-agent stream and in a real agent's tool call.

import { test } from "node:test";
import assert from "node:assert/strict";

import { ansiLines, applySgr, nearest16, plainText, rgbOf256 } from "../ansi.js";
import { applyEvent, createConversation } from "../conversation.js";
import { copyText, FOLD_TAIL, outputBlock, outputKey, preText, setExpanded } from "../output.js";
import { renderItem, toolOutputText } from "../render.js";
import { findAll, textOf, toDom } from "../vdom.js";
import { fakeDocument, readJsonl, readSse, toHtml } from "./helpers.mjs";

const ESC = "\x1b";
/** The lines as `text` or `[cls]text` runs, joined: easy to read in a test. */
const runs = (text) => ansiLines(text).map((line) => line.map((r) => (r.cls ? `[${r.cls}]${r.text}` : r.text)).join("|"));

// ---- ANSI → runs ----

const sgrCases = [
  ["plain text", "a*b*c", ["a*b*c"]],
  ["a red word, then reset", `${ESC}[31mred${ESC}[0m plain`, ["[ansi-red]red| plain"]],
  ["reset with no parameter", `${ESC}[32mgreen${ESC}[m plain`, ["[ansi-green]green| plain"]],
  ["bright foreground", `${ESC}[91mx`, ["[ansi-bright-red]x"]],
  ["background and bright background", `${ESC}[44ma${ESC}[103mb`, ["[ansi-bg-blue]a|[ansi-bg-bright-yellow]b"]],
  ["default foreground and background (39, 49)", `${ESC}[31;42ma${ESC}[39mb${ESC}[49mc`, ["[ansi-red ansi-bg-green]a|[ansi-bg-green]b|c"]],
  ["bold, dim, italic, underline", `${ESC}[1ma${ESC}[2mb${ESC}[22;3mc${ESC}[23;4md${ESC}[24me`, ["[ansi-bold]a|[ansi-bold ansi-dim]b|[ansi-italic]c|[ansi-underline]d|e"]],
  ["strikethrough on and off", `${ESC}[9ma${ESC}[29mb`, ["[ansi-strike]a|b"]],
  ["inverse of the default colours", `${ESC}[7minv${ESC}[27m off`, ["[ansi-fg-inverse ansi-bg-inverse]inv| off"]],
  ["inverse swaps given colours", `${ESC}[31;7mx`, ["[ansi-fg-inverse ansi-bg-red]x"]],
  ["256 colours: the first 16 as they are", `${ESC}[38;5;1ma${ESC}[48;5;12mb`, ["[ansi-red]a|[ansi-red ansi-bg-bright-blue]b"]],
  ["256 colours: the cube's red is the bright red", `${ESC}[38;5;196mx`, ["[ansi-bright-red]x"]],
  ["256 colours: a dark grey is black or bright black", `${ESC}[38;5;236mx`, ["[ansi-black]x"]],
  ["true colour: the nearest of the 16", `${ESC}[38;2;0;200;0mx`, ["[ansi-green]x"]],
  ["true colour background in the colon form", `${ESC}[48:2::250:250:250mx`, ["[ansi-bg-bright-white]x"]],
  ["a true colour then more parameters", `${ESC}[38;2;255;0;0;1mx`, ["[ansi-bold ansi-bright-red]x"]],
  ["an unreadable colour is no colour", `${ESC}[38;5;300mx`, ["x"]],
  ["underline colour (58) shows nothing", `${ESC}[58;5;1;4mx`, ["[ansi-underline]x"]],
  ["a style goes on into the next line", `${ESC}[33mone\ntwo${ESC}[0m\nthree`, ["[ansi-yellow]one", "[ansi-yellow]two", "three"]],
];
for (const [name, input, expected] of sgrCases) {
  test(`ansi: ${name}`, () => assert.deepEqual(runs(input), expected));
}

const stripCases = [
  ["cursor moves and erases", `${ESC}[2J${ESC}[H${ESC}[1;1Hhi${ESC}[K${ESC}[3A${ESC}[?25l`, ["hi"]],
  ["an OSC title ended by BEL", `${ESC}]0;my title\x07text`, ["text"]],
  ["an OSC ended by ST", `${ESC}]2;title${ESC}\\text`, ["text"]],
  ["a hyperlink keeps its text", `${ESC}]8;;https://example.com${ESC}\\link${ESC}]8;;${ESC}\\ after`, ["link after"]],
  ["DCS and APC strings", `${ESC}Pq#0;2;0;0;0${ESC}\\a${ESC}_hidden${ESC}\\b`, ["ab"]],
  ["charset and keypad escapes", `${ESC}(Ba${ESC}=b${ESC}>c${ESC}7d${ESC}8`, ["abcd"]],
  ["an escape cut off at the end (still streaming)", `done${ESC}[3`, ["done"]],
  ["an OSC cut off at the end", `done${ESC}]0;tit`, ["done"]],
  ["a lone ESC", `a${ESC}`, ["a"]],
  ["bell and other controls; tab kept", "a\x07b\x00c\x7fd\te", ["abcd\te"]],
  ["a backspace erases", "ab\bc", ["ac"]],
  ["CRLF is one line end", "one\r\ntwo\r\n", ["one", "two"]],
  ["a progress bar redrawn with \\r shows its last state", "10%\r50%\r100%\ndone", ["100%", "done"]],
  ["a line ending in \\r keeps its text", "almost\r", ["almost"]],
  ["the style before a \\r goes on after it", `${ESC}[32m 1%\r 2%${ESC}[0m`, ["[ansi-green] 2%"]],
  ["a final newline ends the last line", "a\nb\n", ["a", "b"]],
  ["an empty line stays", "a\n\nb", ["a", "", "b"]],
  ["HTML is text", "<img src=x onerror=alert(1)>&amp;", ["<img src=x onerror=alert(1)>&amp;"]],
];
for (const [name, input, expected] of stripCases) {
  test(`ansi: ${name}`, () => assert.deepEqual(runs(input), expected));
}

test("ansi: the 256-colour palette and the nearest of the 16", () => {
  assert.deepEqual(rgbOf256(16), [0, 0, 0]);
  assert.deepEqual(rgbOf256(231), [255, 255, 255]);
  assert.deepEqual(rgbOf256(244), [128, 128, 128]);
  assert.equal(nearest16([0, 0, 0]), 0);
  assert.equal(nearest16([255, 255, 255]), 15);
  assert.equal(nearest16([128, 128, 128]), 8);
  assert.equal(nearest16([0, 0, 238]), 4);
  assert.deepEqual(applySgr({ fg: null, bg: null }, "38;5;46").fg, 10);
});

test("ansi: the plain text has no escape left", () => {
  const text = `${ESC}[1;31merror${ESC}[0m: ${ESC}]0;t\x07x\r${ESC}[Kfile.rs:3 ${ESC}[1;31merror${ESC}[0m\n${ESC}[2mnote${ESC}[0m\n`;
  assert.equal(plainText(ansiLines(text)), "file.rs:3 error\nnote");
});

// ---- the block ----

const classesOf = (node) => String(node.attrs.class ?? "").split(" ");
const buttons = (node) => findAll(node, (n) => n.tag === "button");
const preOf = (node) => findAll(node, (n) => n.tag === "pre")[0];

test("output: monospace pre, lines split by <br>, colours as classes, no Markdown", () => {
  const node = outputBlock(`a*b*c\n# x\n${ESC}[31mred${ESC}[0m plain\n`, { key: "k", preClass: "msg agent" });
  const pre = preOf(node);
  assert.deepEqual(classesOf(pre), ["term-text", "msg", "agent"]);
  assert.equal(toHtml(pre), '<pre class="term-text msg agent">a*b*c<br># x<br><span class="ansi-red">red</span> plain</pre>');
  assert.equal(textOf(pre), "a*b*c\n# x\nred plain");
  assert.deepEqual(classesOf(node), ["output-block"]);
  assert.deepEqual(buttons(node).map((b) => [textOf(b), b.attrs["data-action"]]), [["Copy", "output-copy"]]);
});

test("output: HTML in output stays text and makes only the block's own elements", () => {
  const node = outputBlock(`<script>alert(1)</script>\n<img src=x onerror=alert(2)>\n${ESC}[1m<b>bold?</b>${ESC}[0m`, { key: "h" });
  const element = toDom(node, fakeDocument);
  const tags = new Set(element.descendants().map((e) => e.tagName));
  assert.deepEqual([...tags].sort(), ["BR", "BUTTON", "DIV", "PRE", "SPAN"]);
  assert.equal(preText(element.descendants().find((e) => e.tagName === "PRE")), "<script>alert(1)</script>\n<img src=x onerror=alert(2)>\n<b>bold?</b>");
  for (const e of element.descendants()) {
    for (const name of e.attributes.keys()) assert.ok(["class", "type", "data-action"].includes(name), name);
  }
});

test("output: 40 lines are shown whole, 41 are folded to the last 20", () => {
  const lines = (n) => Array.from({ length: n }, (_, i) => `line ${i + 1}`).join("\n") + "\n";
  const whole = outputBlock(lines(40), { key: "w" });
  assert.equal(findAll(whole, (n) => classesOf(n).includes("term-text-head")).length, 0);
  assert.deepEqual(buttons(whole).map(textOf), ["Copy"]);

  const folded = outputBlock(lines(41), { key: "f" });
  assert.ok(classesOf(folded).includes("output-folded"));
  const head = findAll(folded, (n) => classesOf(n).includes("term-text-head"))[0];
  assert.equal(textOf(head), lines(21));
  assert.deepEqual(buttons(folded).map(textOf), ["Show all 41 lines", "Copy", "Show all 41 lines"]);
  // The whole text is there (Copy takes it all); what is after the hidden head is the last 20.
  assert.equal(textOf(preOf(folded)), lines(41).trimEnd());
  assert.equal(textOf(preOf(folded)).slice(textOf(head).length).split("\n").length, FOLD_TAIL);
});

test("output: 5,000 lines fold, and unfold once their key is set (kept while streaming)", () => {
  const text = Array.from({ length: 5000 }, (_, i) => String(i + 1)).join("\n") + "\n";
  const key = outputKey(7, 42, 0);
  assert.equal(key, "7@42#0");
  const folded = outputBlock(text, { key });
  assert.deepEqual(buttons(folded).map(textOf), ["Show all 5,000 lines", "Copy", "Show all 5,000 lines"]);
  assert.equal(buttons(folded)[0].attrs["data-action"], "output-toggle");
  setExpanded(key, true);
  try {
    const open = outputBlock(text + "5001\n", { key });
    assert.ok(classesOf(open).includes("output-open"));
    assert.deepEqual(buttons(open).map(textOf), [`Show last ${FOLD_TAIL} lines`, "Copy", `Show last ${FOLD_TAIL} lines`]);
  } finally {
    setExpanded(key, false);
  }
  assert.ok(classesOf(outputBlock(text, { key })).includes("output-folded"));
});

test("output: the copied text is the plain text, folded lines included", () => {
  const text = Array.from({ length: 60 }, (_, i) => `${ESC}[3${i % 8}mrow ${i}${ESC}[0m\t*`).join("\n");
  const element = toDom(outputBlock(text, { key: "c" }), fakeDocument);
  const pre = element.descendants().find((e) => e.tagName === "PRE");
  assert.equal(preText(pre), Array.from({ length: 60 }, (_, i) => `row ${i}\t*`).join("\n"));
});

test("output: Copy uses the Clipboard API, else a selected textarea and execCommand", async () => {
  const written = [];
  const saved = Object.getOwnPropertyDescriptor(globalThis, "navigator");
  const setNavigator = (value) => Object.defineProperty(globalThis, "navigator", { value, configurable: true, writable: true });
  const appended = [];
  const doc = {
    createElement: (tag) => ({ tag, setAttribute() {}, select() { this.selected = true; }, remove() { this.removed = true; } }),
    body: { append: (e) => appended.push(e) },
    execCommand: (command) => command === "copy" && appended.at(-1).selected,
  };
  try {
    setNavigator({ clipboard: { writeText: async (text) => written.push(text) } });
    assert.equal(await copyText("a*b*c\n# x", doc), true);
    assert.deepEqual(written, ["a*b*c\n# x"]);
    setNavigator({}); // no Clipboard API (plain http from another machine)
    assert.equal(await copyText("fallback", doc), true);
    assert.equal(appended.length, 1);
    assert.deepEqual([appended[0].value, appended[0].className, appended[0].removed], ["fallback", "copy-buffer", true]);
    setNavigator({ clipboard: { writeText: async () => Promise.reject(new Error("denied")) } });
    doc.execCommand = () => {
      throw new Error("no");
    };
    assert.equal(await copyText("x", doc), false);
  } finally {
    if (saved) Object.defineProperty(globalThis, "navigator", saved);
    else delete globalThis.navigator;
  }
});

// ---- which agent text is a command's output ----

function fold(events) {
  const conversation = createConversation();
  for (const event of events) applyEvent(conversation, event);
  return conversation;
}

test("the shell agent's command output is output; its own words are prose", () => {
  const conversation = fold(readSse("shell-agent.sse"));
  const agent = conversation.items.filter((item) => item.kind === "agent").map((item) => [item.outputOf, item.text.slice(0, 12)]);
  assert.deepEqual(agent, [
    ["cmd-1", "hi\n"],
    ["cmd-4", "<img src=x o"],
    [null, "Not run: per"],
    ["cmd-7", "# Title\n\n- o"],
    [null, "[command end"],
    ["cmd-9", "part1 part2 "],
  ]);
});

test("Markdown a command printed is shown as typed, in a pre", () => {
  const conversation = fold(readSse("shell-agent.sse"));
  const item = conversation.items.find((i) => i.outputOf === "cmd-7");
  const node = renderItem(item);
  assert.equal(node.attrs["data-item"], item.id);
  assert.equal(node.attrs["data-seq"], item.seq);
  assert.equal(findAll(node, (n) => ["h3", "ul", "li", "a", "code", "p", "strong", "em"].includes(n.tag)).length, 0);
  assert.equal(textOf(preOf(node)), item.text.trimEnd());
  // The agent's own words stay Markdown.
  const prose = conversation.items.find((i) => i.kind === "agent" && i.outputOf === null);
  assert.equal(toHtml(renderItem(prose)), '<div class="msg agent"><p>Not run: permission to run <code>rm -f nothing</code> was refused.</p></div>');
});

test("prose after a command's output is a new message, not more output", () => {
  const events = readSse("shell-agent.sse").filter((e) => e.turn === 1);
  const conversation = fold(events);
  applyEvent(conversation, { seq: 100, turn: 1, type: "update", update: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "**Done.**" } } });
  const agent = conversation.items.filter((i) => i.kind === "agent");
  assert.deepEqual(agent.map((i) => [i.outputOf, i.text]), [["cmd-1", "hi\n"], [null, "**Done.**"]]);
  assert.equal(toHtml(renderItem(agent[1])), '<div class="msg agent"><p><strong>Done.</strong></p></div>');
});

test("a tool call's text content is terminal text, a fenced block unwrapped", () => {
  const events = [
    ...readJsonl("acp-extras.jsonl").slice(0, 2),
    {
      seq: 3,
      turn: 1,
      type: "update",
      update: {
        sessionUpdate: "tool_call",
        toolCallId: "bash-1",
        title: "ls --color",
        kind: "execute",
        status: "completed",
        content: [{ type: "content", content: { type: "text", text: `\`\`\`console\n${ESC}[34msrc${ESC}[0m  a*b*c\n# x\n\`\`\`` } }],
      },
    },
  ];
  const conversation = fold(events);
  const tool = conversation.items.find((i) => i.kind === "tool");
  const node = renderItem(tool);
  const pre = preOf(node);
  assert.deepEqual(classesOf(pre), ["term-text", "output"]);
  assert.equal(toHtml(pre), '<pre class="term-text output"><span class="ansi-blue">src</span>  a*b*c<br># x</pre>');
  assert.equal(buttons(node).map(textOf).join(","), "Copy");
  assert.equal(toolOutputText("```\na\n```\nmore"), "```\na\n```\nmore");
  assert.equal(toolOutputText("plain"), "plain");
});
