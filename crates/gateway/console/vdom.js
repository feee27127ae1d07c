// A tiny description of DOM nodes, so that rendering decisions are pure data that tests can read
// without a browser: `h(tag, attrs, ...children)` builds `{tag, attrs, children}` (children are
// nodes or strings, which are always text), and `toDom` turns one into real elements with
// `createElement`, `setAttribute` and text nodes. Deliberately absent: `innerHTML`, event
// handler attributes and `style` attributes (the console's CSP refuses those anyway); `toDom`
// refuses any tag or attribute outside the short lists below, so a rendering mistake cannot
// create an `<img>`, `<script>` or `<iframe>` from agent text.

const TAGS = new Set([
  "div", "p", "span", "pre", "code", "a", "ul", "ol", "li", "details", "summary", "strong",
  "em", "hr", "h3", "h4", "h5", "h6", "br", "blockquote", "button", "del", "ins",
]);
const ATTRIBUTES = new Set([
  "class", "href", "rel", "target", "role", "title", "type", "open",
  "aria-label", "aria-hidden", "data-seq", "data-item", "data-request-id", "data-option-id",
  "data-terminal-id", "data-action", "data-list", "data-rule", "data-credential", "aria-checked",
  "disabled", "data-checkpoint", "data-session", "data-path", "download",
]);

// Links lead to the web or to this origin, never to `javascript:` or `data:`.
const SAFE_HREF = /^(https?:\/\/|\/(?!\/))/i;

/** One node: `h("p", {class: "x"}, "text", h("code", {}, "y"))`. Falsy children are skipped. */
export function h(tag, attrs, ...children) {
  return { tag, attrs: attrs || {}, children: children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false && c !== "") };
}

/** The text a node would show, as `textContent` would give it. */
export function textOf(node) {
  if (typeof node === "string") return node;
  if (node.tag === "br") return "\n";
  return node.children.map(textOf).join("");
}

/** Every node in the tree (depth first) for which `pred` holds. */
export function findAll(node, pred, found = []) {
  if (typeof node === "string") return found;
  if (pred(node)) found.push(node);
  for (const child of node.children) findAll(child, pred, found);
  return found;
}

/** Builds the real DOM for `node` in `doc`. */
export function toDom(node, doc) {
  if (typeof node === "string") return doc.createTextNode(node);
  if (!TAGS.has(node.tag)) throw new Error(`vdom: tag <${node.tag}> is not allowed`);
  const element = doc.createElement(node.tag);
  for (const [name, value] of Object.entries(node.attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (!ATTRIBUTES.has(name)) throw new Error(`vdom: attribute ${name} is not allowed`);
    if (name === "href" && !SAFE_HREF.test(String(value))) throw new Error(`vdom: href ${value} is not allowed`);
    element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of node.children) element.appendChild(toDom(child, doc));
  return element;
}
