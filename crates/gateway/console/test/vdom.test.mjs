// The last guard between rendering and the page: `toDom` refuses what the console never means
// to create.

import { test } from "node:test";
import assert from "node:assert/strict";

import { h, toDom } from "../vdom.js";
import { fakeDocument } from "./helpers.mjs";

test("toDom builds elements and text nodes", () => {
  const element = toDom(h("p", { class: "x" }, "a <b>", h("code", {}, "c")), fakeDocument);
  assert.equal(element.tagName, "P");
  assert.equal(element.getAttribute("class"), "x");
  assert.equal(element.textContent, "a <b>c");
  assert.deepEqual(element.descendants().map((e) => e.tagName), ["CODE"]);
});

const refused = [
  ["an img element", h("img", { src: "x" })],
  ["a script element", h("script", {}, "alert(1)")],
  ["an iframe", h("iframe", {})],
  ["an event handler attribute", h("p", { onclick: "alert(1)" })],
  ["a style attribute", h("p", { style: "color: red" })],
  ["a javascript: href", h("a", { href: "javascript:alert(1)" })],
  ["a protocol-relative href", h("a", { href: "//evil.example/" })],
];
for (const [name, node] of refused) {
  test(`toDom refuses ${name}`, () => assert.throws(() => toDom(node, fakeDocument), /not allowed/));
}
