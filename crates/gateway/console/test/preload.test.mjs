// index.html names, as `modulepreload` links, exactly the modules main.js imports statically at
// any depth: a module missing from the list is fetched a round trip later, one named but no
// longer imported is fetched for nothing.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

const folder = new URL("../", import.meta.url);
const read = (name) => readFileSync(new URL(name, folder), "utf8");

/** The console modules `name` imports statically (`import … from "./x.js"`, `import "./x.js"`). */
function staticImports(name) {
  const source = read(name);
  const found = [];
  for (const match of source.matchAll(/^\s*import\s+(?:[^"';]*?\s+from\s+)?["']\.\/([^"']+)["']/gm)) {
    found.push(match[1]);
  }
  return found;
}

test("index.html preloads every module main.js imports, and no other", () => {
  const closure = new Set();
  const queue = ["main.js"];
  while (queue.length > 0) {
    for (const name of staticImports(queue.pop())) {
      if (!closure.has(name)) {
        closure.add(name);
        queue.push(name);
      }
    }
  }
  const preloaded = [...read("index.html").matchAll(/<link rel="modulepreload" href="\/console\/([^"]+)">/g)].map((m) => m[1]);
  assert.equal(new Set(preloaded).size, preloaded.length, "each module once");
  assert.deepEqual([...preloaded].sort(), [...closure].sort());
  assert.ok(closure.has("ansi.js"), "the walk reaches the third level");
});
