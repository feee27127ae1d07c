// The console's places in the location hash (route.js): the links phone.md gives out, the form
// the console writes, and hashes that belong to someone else.

import { test } from "node:test";
import assert from "node:assert/strict";

import { parseRoute, routeHash, sameRoute } from "../route.js";

const session = (id, view = "chat", extra = {}) => ({ kind: "session", id, view, dir: "", file: null, checkpoint: null, show: null, requestId: null, ...extra });
const changes = (id, cid) => session(id, "checkpoints", { checkpoint: cid, show: "diff" });

const cases = [
  ["", { kind: "list" }],
  ["#", { kind: "list" }],
  ["#/", { kind: "list" }],
  // phone.md's links (a push notification opens these)
  ["#/s/abc123", session("abc123")],
  ["#/s/abc123/r/perm-7", session("abc123", "chat", { requestId: "perm-7" })],
  ["#/s/abc123/terminal", session("abc123", "terminal")],
  ["#/s/a%20b/files", session("a b", "files")],
  // the form the console writes, and bookmarks of it
  ["#session=abc123&view=chat", session("abc123")],
  ["#session=abc123&view=network", session("abc123", "network")],
  ["#session=abc123", session("abc123")],
  ["#session=abc123&view=nonsense", session("abc123")],
  ["#session=abc123&view=files&dir=src%2Flib&file=src%2Flib%2Fa.rs", session("abc123", "files", { dir: "src/lib", file: "src/lib/a.rs" })],
  ["#session=abc123&view=chat&file=x", session("abc123")],
  // the Checkpoints view: the list, a checkpoint's changes, its files (a folder, a file)
  ["#/s/abc123/checkpoints", session("abc123", "checkpoints")],
  ["#/s/abc123/checkpoints/ck%2F1", changes("abc123", "ck/1")],
  ["#session=abc123&view=checkpoints", session("abc123", "checkpoints")],
  ["#session=abc123&view=checkpoints&checkpoint=ck1&show=diff", changes("abc123", "ck1")],
  ["#session=abc123&view=checkpoints&checkpoint=ck1&show=files&dir=src&file=src%2Fa.rs", session("abc123", "checkpoints", { checkpoint: "ck1", show: "files", dir: "src", file: "src/a.rs" })],
  // a folder only where there are files; a checkpoint only with what to show of it
  ["#session=abc123&view=checkpoints&checkpoint=ck1&show=diff&dir=src", changes("abc123", "ck1")],
  ["#session=abc123&view=checkpoints&checkpoint=ck1", session("abc123", "checkpoints")],
  ["#session=abc123&view=checkpoints&checkpoint=ck1&show=bogus", session("abc123", "checkpoints")],
  ["#session=abc123&view=checkpoints&show=diff", session("abc123", "checkpoints")],
  ["#session=abc123&view=chat&checkpoint=ck1&show=diff", session("abc123")],
  // someone else's
  ["#/pair/ABCD-EFGH", { kind: "external" }],
  ["#/devices", { kind: "external" }],
  // nothing the console knows
  ["#/s/", { kind: "unknown" }],
  ["#/s/abc/r", { kind: "unknown" }],
  ["#/s/abc/bogus", { kind: "unknown" }],
  ["#/s/abc/checkpoints/", { kind: "unknown" }],
  ["#/s/abc/files/x", { kind: "unknown" }],
  ["#/s/%E0%A4%A/chat", { kind: "unknown" }],
  ["#view=chat", { kind: "unknown" }],
];
for (const [hash, route] of cases) {
  test(`route of ${JSON.stringify(hash)}`, () => assert.deepEqual(parseRoute(hash), route));
}

test("the console writes the session form, which reads back as the same place", () => {
  const places = [
    [session("abc"), "#session=abc&view=chat"],
    [session("abc", "terminal"), "#session=abc&view=terminal"],
    [session("a&b=c", "files", { dir: "src", file: "src/main.rs" }), "#session=a%26b%3Dc&view=files&dir=src&file=src%2Fmain.rs"],
    [session("abc", "chat", { requestId: "perm-1" }), "#session=abc&view=chat"],
    [session("abc", "checkpoints"), "#session=abc&view=checkpoints"],
    [changes("abc", "ck 1"), "#session=abc&view=checkpoints&checkpoint=ck+1&show=diff"],
    [session("abc", "checkpoints", { checkpoint: "ck1", show: "files", dir: "d", file: "d/x" }), "#session=abc&view=checkpoints&checkpoint=ck1&show=files&dir=d&file=d%2Fx"],
    [{ kind: "list" }, ""],
    [{ kind: "external" }, ""],
  ];
  for (const [route, hash] of places) {
    assert.equal(routeHash(route), hash, JSON.stringify(route));
    if (route.kind === "session") assert.deepEqual(parseRoute(hash), { ...route, requestId: null });
  }
});

test("a request to scroll to does not make another place; a view, a folder, a file or a checkpoint does", () => {
  assert.ok(sameRoute(session("a"), session("a", "chat", { requestId: "r" })));
  assert.ok(sameRoute(parseRoute("#/s/a"), parseRoute("#session=a&view=chat")));
  assert.ok(!sameRoute(session("a"), session("a", "files")));
  assert.ok(!sameRoute(session("a", "files"), session("a", "files", { dir: "src" })));
  assert.ok(!sameRoute(session("a", "files"), session("a", "files", { file: "x" })));
  assert.ok(!sameRoute(session("a"), session("b")));
  assert.ok(!sameRoute(session("a", "checkpoints"), changes("a", "c")));
  assert.ok(!sameRoute(changes("a", "c"), changes("a", "d")));
  assert.ok(!sameRoute(changes("a", "c"), session("a", "checkpoints", { checkpoint: "c", show: "files" })));
  assert.ok(sameRoute(parseRoute("#/s/a/checkpoints/c"), changes("a", "c")));
  assert.ok(!sameRoute({ kind: "list" }, { kind: "external" }));
  assert.ok(sameRoute({ kind: "list" }, { kind: "list" }));
});
