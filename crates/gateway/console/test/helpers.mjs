// Shared test helpers: reading the recorded event streams, a readable HTML serialisation of
// `vdom` nodes (text escaped, so a test sees exactly what would be an element and what text),
// and a tiny stand-in for `document` that is enough for `toDom`.

import { readFileSync } from "node:fs";

const fixtures = new URL("./fixtures/", import.meta.url);

/** The events of a saved `text/event-stream` (the `data:` of each block, parsed). */
export function readSse(name) {
  const text = readFileSync(new URL(name, fixtures), "utf8");
  return text
    .split(/\n\n/)
    .map((block) => block.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trimStart()).join("\n"))
    .filter((data) => data !== "")
    .map((data) => JSON.parse(data));
}

/** The events of a JSON-lines fixture. */
export function readJsonl(name) {
  return readFileSync(new URL(name, fixtures), "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line));
}

/** A JSON fixture, parsed. */
export function readJson(name) {
  return JSON.parse(readFileSync(new URL(name, fixtures), "utf8"));
}

const escape = (text) => text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** `vdom` nodes as HTML, attributes in the order given, `data-item`/`data-seq` left out. */
export function toHtml(node) {
  if (Array.isArray(node)) return node.map(toHtml).join("");
  if (typeof node === "string") return escape(node);
  const attrs = Object.entries(node.attrs)
    .filter(([name, value]) => value !== null && value !== undefined && value !== false && name !== "data-item" && name !== "data-seq")
    .map(([name, value]) => (value === true ? ` ${name}` : ` ${name}="${escape(String(value))}"`))
    .join("");
  if (node.tag === "br" || node.tag === "hr") return `<${node.tag}${attrs}>`;
  return `<${node.tag}${attrs}>${node.children.map(toHtml).join("")}</${node.tag}>`;
}

class FakeText {
  constructor(text) {
    this.nodeType = 3;
    this.data = text;
  }
  get textContent() {
    return this.data;
  }
}

class FakeElement {
  constructor(tag) {
    this.nodeType = 1;
    this.tagName = tag.toUpperCase();
    this.attributes = new Map();
    this.childNodes = [];
  }
  setAttribute(name, value) {
    this.attributes.set(name, String(value));
  }
  getAttribute(name) {
    return this.attributes.get(name) ?? null;
  }
  appendChild(child) {
    this.childNodes.push(child);
    return child;
  }
  get textContent() {
    return this.childNodes.map((c) => c.textContent).join("");
  }
  /** Every element below this one (depth first). */
  descendants() {
    return this.childNodes.filter((c) => c.nodeType === 1).flatMap((c) => [c, ...c.descendants()]);
  }
}

/** Enough of `document` for `toDom`: createElement and createTextNode. */
export const fakeDocument = {
  createElement: (tag) => new FakeElement(tag),
  createTextNode: (text) => new FakeText(text),
};
