// Command output as terminal text: `outputBlock(text, …)` is a pure function to `vdom` nodes (a
// monospace `<pre>`, whitespace kept, no Markdown, ANSI colours as classes from ansi.js, one
// `<br>` between lines), folded when long (the last FOLD_TAIL lines shown, "Show all N lines"
// brings the rest back and takes it away again), with a Copy button. `installOutputActions`
// answers those two buttons in the page: the fold is a class on the block (no re-render), and
// is remembered by the block's place (its item's `data-item`/`data-seq`, its index in the
// item), so an output that is still streaming, re-rendered at every chunk, stays unfolded.
// Copy puts the plain text (no escapes) on the clipboard, with a fallback where the
// Clipboard API is missing (a page served over plain http from another machine).

import { h } from "./vdom.js";
import { ansiLines } from "./ansi.js";

/** An output of more lines than this is folded... */
export const FOLD_OVER = 40;
/** ...to its last this many lines. */
export const FOLD_TAIL = 20;

const expanded = new Set();

/** The key that remembers a block's fold: its item's id and seq, its index in the item. */
export const outputKey = (itemId, seq, index) => `${itemId}@${seq}#${index}`;

/** Unfolds (`on`) or folds the block of `key` at its next rendering. */
export function setExpanded(key, on) {
  if (on) expanded.add(key);
  else expanded.delete(key);
}

export const isExpanded = (key) => expanded.has(key);

/** The toggle's words for an output of `n` lines, folded or not. */
export function toggleWords(n, open) {
  return open ? `Show last ${FOLD_TAIL} lines` : `Show all ${n.toLocaleString("en-US")} lines`;
}

// Nodes made directly (`h()`'s flattening costs more than the rest for 20,000 lines).
const BR = { tag: "br", attrs: {}, children: [] };

function lineNodes(lines, brAfterLast) {
  const out = [];
  lines.forEach((runs, n) => {
    for (const run of runs) {
      if (run.text === "") continue;
      out.push(run.cls ? { tag: "span", attrs: { class: run.cls }, children: [run.text] } : run.text);
    }
    if (brAfterLast || n < lines.length - 1) out.push(BR);
  });
  return out;
}

/**
 * The block for terminal output `text`: `attrs` go on the outer `div` (its class joined with
 * `output-block`), `preClass` on the `<pre>` (with `term-text`); `key` (outputKey) says whether a
 * long one shows all its lines.
 */
export function outputBlock(text, { key, attrs = {}, preClass = "" } = {}) {
  const lines = ansiLines(text);
  const folds = lines.length > FOLD_OVER;
  const open = folds && expanded.has(key);
  const cut = folds ? lines.length - FOLD_TAIL : 0;
  const tail = lineNodes(lines.slice(cut), false);
  const pre = {
    tag: "pre",
    attrs: { class: ["term-text", preClass].filter(Boolean).join(" ") },
    children: folds ? [{ tag: "span", attrs: { class: "term-text-head" }, children: lineNodes(lines.slice(0, cut), true) }, ...tail] : tail,
  };
  const toggle = (where) =>
    h("button", { type: "button", class: `small output-toggle output-toggle-${where}`, "data-action": "output-toggle" }, toggleWords(lines.length, open));
  const state = folds ? (open ? "output-open" : "output-folded") : "";
  return h(
    "div",
    { ...attrs, class: [attrs.class, "output-block", state].filter(Boolean).join(" ") },
    h("div", { class: "output-tools" }, folds ? toggle("top") : null, h("button", { type: "button", class: "small output-copy", "data-action": "output-copy" }, "Copy")),
    pre,
    folds ? h("div", { class: "output-tools output-tools-end" }, toggle("end")) : null,
  );
}

/** The text a rendered `<pre>` shows, folded part included: its text, a newline per `<br>`. */
export function preText(node) {
  let text = "";
  const walk = (n) => {
    for (const child of n.childNodes) {
      if (child.nodeType === 3) text += child.data;
      else if (child.nodeType === 1) {
        if (child.tagName === "BR") text += "\n";
        else walk(child);
      }
    }
  };
  walk(node);
  return text;
}

function blockKey(block) {
  const item = block.closest("[data-item]");
  if (!item) return null;
  const index = [...item.querySelectorAll(".output-block")].indexOf(block);
  return outputKey(item.dataset.item, item.dataset.seq, index);
}

function toggle(block, button) {
  const open = !block.classList.contains("output-open");
  block.classList.toggle("output-open", open);
  block.classList.toggle("output-folded", !open);
  const key = blockKey(block);
  if (key) setExpanded(key, open);
  const pre = block.querySelector("pre");
  const n = pre.querySelectorAll("br").length + 1;
  for (const b of block.querySelectorAll("button.output-toggle")) b.textContent = toggleWords(n, open);
  // Folded from the button under the output: the output's top, not 400,000 px of nothing.
  if (!open && button.classList.contains("output-toggle-end")) block.scrollIntoView({ block: "nearest" });
}

/** Copies `text`: the Clipboard API, or a selected hidden textarea and `execCommand("copy")`. */
export async function copyText(text, doc = document) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = doc.createElement("textarea");
    area.className = "copy-buffer";
    area.setAttribute("readonly", "");
    area.setAttribute("aria-hidden", "true");
    area.value = text;
    doc.body.append(area);
    try {
      area.select();
      return doc.execCommand("copy");
    } catch {
      return false;
    } finally {
      area.remove();
    }
  }
}

const copiedTimers = new WeakMap();

async function copy(block, button) {
  const ok = await copyText(preText(block.querySelector("pre")), block.ownerDocument);
  button.textContent = ok ? "Copied" : "Copy failed";
  clearTimeout(copiedTimers.get(button));
  copiedTimers.set(
    button,
    setTimeout(() => {
      button.textContent = "Copy";
    }, 2000),
  );
}

/** Answers the blocks' buttons anywhere in `doc` (once per document). */
export function installOutputActions(doc) {
  if (doc.warrenOutputActions) return;
  doc.warrenOutputActions = true;
  doc.addEventListener("click", (event) => {
    const button = event.target.closest?.('button[data-action^="output-"]');
    const block = button?.closest(".output-block");
    if (!block) return;
    if (button.dataset.action === "output-toggle") toggle(block, button);
    else if (button.dataset.action === "output-copy") copy(block, button);
  });
}

if (typeof document !== "undefined" && typeof document.addEventListener === "function") installOutputActions(document);
