// Shared test helpers: reading the recorded event streams, a readable HTML serialisation of
// `vdom` nodes (text escaped, so a test sees exactly what would be an element and what text),
// a tiny stand-in for `document` that is enough for `toDom`, and the Network view on fake
// elements against a fake gateway.

import { readFileSync } from "node:fs";

import { ApiError } from "../api.js";
import { NetworkView } from "../network.js";

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

/** Enough of an element for the views: listeners (`fire` calls them), value, text, children. */
export class FakeControl {
  constructor() {
    this.listeners = {};
    this.value = "";
    this.textContent = "";
    this.hidden = true;
    this.disabled = false;
    this.children = [];
    this.elements = [];
  }
  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }
  replaceChildren(...children) {
    this.children = children;
  }
  fire(type, extra = {}) {
    for (const listener of this.listeners[type] ?? []) listener({ preventDefault() {}, ...extra });
  }
}

/**
 * A Network view on fake elements and a fake gateway that keeps one session's `egress` (the
 * `network` given replaces its own). A PUT takes what it names, as the gateway does: the policy
 * and rules, and `credentials` when present (a name `available_credentials` lacks is refused
 * with 400 `UNKNOWN_CREDENTIAL`, and `enabled` follows). `refuse(body)` may return an error to
 * throw instead. Every request is kept in `requests`.
 */
export function networkHarness({ egress: start, network = "private", refuse = () => null, timers = globalThis, now = () => Date.now() }) {
  globalThis.document = fakeDocument;
  const names = ["mode", "error", "policy", "policyHelp", "allowList", "allowForm", "allowInput", "allowError", "denyList", "denyForm", "denyInput", "denyError", "recent", "credentials", "refresh"];
  const el = Object.fromEntries(names.map((name) => [name, new FakeControl()]));
  el.allowForm.elements = [el.allowInput];
  el.denyForm.elements = [el.denyInput];
  let egress = structuredClone({ ...start, network });
  const requests = [];
  const api = {
    async request(method, path, options = {}) {
      requests.push({ method, path, body: options.json });
      await new Promise((resolve) => setImmediate(resolve));
      if (method === "PUT") {
        const error = refuse(options.json);
        if (error) throw error;
        const { credentials, ...rules } = options.json;
        if (credentials !== undefined) {
          const offered = egress.available_credentials ?? [];
          const unknown = credentials.find((name) => !offered.some((c) => c.name === name));
          if (unknown !== undefined) throw new ApiError(400, "UNKNOWN_CREDENTIAL", `no credential named ${unknown} is offered to this session`);
          egress.credentials = [...credentials];
          for (const c of offered) c.enabled = credentials.includes(c.name);
        }
        egress = { ...egress, ...rules };
      }
      return structuredClone(egress);
    },
    /** Changes what the gateway keeps, as another device or a restart would. */
    set(change) {
      egress = { ...egress, ...change };
    },
  };
  const view = new NetworkView({ elements: el, api, timers, now });
  view.setSession("s1");
  return { view, el, requests, api };
}

/** A click inside a list whose nearest matching button has `dataset`. */
export const click = (list, dataset) => list.fire("click", { target: { closest: () => ({ dataset }) } });

/** The aria-labels of the buttons rendered into a fake list. */
export const buttonLabels = (list) => list.children.flatMap((li) => li.descendants().filter((e) => e.tagName === "BUTTON").map((b) => b.getAttribute("aria-label")));
