// The on-screen keyboard (viewport.js): when the page folds its header and fits what is left.

import { test } from "node:test";
import assert from "node:assert/strict";

import { isEditable, keyboardOpen } from "../viewport.js";

const cases = [
  // [visible, full, a text field focused, open]
  [450, 844, true, true], // a phone's keyboard (what the browser tests set)
  [520, 844, true, true],
  [844, 844, true, false], // a field focused, no keyboard (a hardware one, a desktop)
  [700, 844, true, false], // a browser bar showing, not a keyboard
  [450, 844, false, false], // a short window, nothing focused
  [0, 0, true, false],
];
for (const [visibleHeight, fullHeight, editing, open] of cases) {
  test(`keyboard with ${visibleHeight} of ${fullHeight} px, editing ${editing}: ${open}`, () =>
    assert.equal(keyboardOpen({ visibleHeight, fullHeight, editing }), open));
}

test("what takes typing", () => {
  const el = (tagName, extra = {}) => ({ tagName, ...extra });
  assert.ok(isEditable(el("TEXTAREA")));
  assert.ok(isEditable(el("INPUT", { type: "text" })));
  assert.ok(isEditable(el("INPUT", { type: "password" })));
  assert.ok(isEditable(el("INPUT", { type: "number" })));
  assert.ok(isEditable(el("DIV", { isContentEditable: true })));
  assert.ok(!isEditable(el("INPUT", { type: "checkbox" })));
  assert.ok(!isEditable(el("INPUT", { type: "file" })));
  assert.ok(!isEditable(el("BUTTON")));
  assert.ok(!isEditable(el("SELECT")));
  assert.ok(!isEditable(null));
});
