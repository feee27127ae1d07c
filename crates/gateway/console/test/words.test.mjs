// The session's state in words, from the session object's fields (docs/gateway.md).

import { test } from "node:test";
import assert from "node:assert/strict";

import { stateWords } from "../render.js";

const cases = [
  [{ status: "idle", brain: "warm", hands: "none", isolation: "bwrap" }, "idle · agent warm · hands not started · sandboxed (bwrap)"],
  [{ status: "running", brain: "ready", hands: "running", isolation: "bwrap" }, "working · agent ready · hands running · sandboxed (bwrap)"],
  [{ status: "idle", brain: "none", hands: "archived", isolation: "none" }, "idle · agent not started · hands archived · no isolation"],
  [{ status: "idle", brain: "ready", hands: "paused", isolation: "remote" }, "idle · agent ready · hands paused · remote hands"],
];
for (const [session, words] of cases) {
  test(`state words: ${words}`, () => assert.equal(stateWords(session), words));
}
