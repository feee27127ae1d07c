// The pinned npm `e2b` SDK (tests/node/package.json) in debug mode against
// `warren execd --e2b-listen`. Usage: node e2b_sdk_test.mjs URL ROOT. Every check runs; failures
// are printed by name and the script exits non-zero, else it prints "all e2b JS SDK checks passed".

import { Sandbox, CommandExitError, NotFoundError, TimeoutError, FilesystemEventType } from "e2b";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { join } from "node:path";

const [url, root] = process.argv.slice(2);
const path = (rel) => join(root, rel);
const failures = [];
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
async function until(what, predicate, ms = 10000) {
  const deadline = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}
function assert(condition, message) {
  if (!condition) throw new Error(message);
}
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (error) {
    failures.push(name);
    console.log(`FAIL ${name}\n${error?.stack ?? error}`);
  }
}
async function rejects(promise, type) {
  try {
    await promise;
  } catch (error) {
    assert(error instanceof type, `expected ${type.name}, got ${error?.constructor?.name}: ${error}`);
    return error;
  }
  throw new Error(`expected ${type.name}, got success`);
}

const sbx = await Sandbox.create({ debug: true, sandboxUrl: url });

await check("run: stdout, stderr, envs, cwd", async () => {
  const result = await sbx.commands.run("echo $X; echo err >&2; pwd", { envs: { X: "js" }, cwd: root });
  assert(result.stdout === `js\n${root}\n`, JSON.stringify(result));
  assert(result.stderr === "err\n", JSON.stringify(result));
});

await check("a failing command throws CommandExitError", async () => {
  const error = await rejects(sbx.commands.run("exit 5"), CommandExitError);
  assert(error.exitCode === 5, `exit code ${error.exitCode}`);
});

await check("a timeout throws TimeoutError", async () => {
  await rejects(sbx.commands.run("sleep 30", { timeoutMs: 3000 }), TimeoutError);
});

await check("background: list, connect, sendStdin, kill", async () => {
  const handle = await sbx.commands.run("read l; echo got:$l; sleep 60", { background: true, stdin: true });
  const listed = await sbx.commands.list();
  assert(listed.some((p) => p.pid === handle.pid), JSON.stringify(listed));
  let seen = "";
  const other = await sbx.commands.connect(handle.pid, { onStdout: (data) => { seen += data; } });
  await sbx.commands.sendStdin(handle.pid, "hi\n");
  await until("got:hi", () => seen.includes("got:hi"));
  assert(await sbx.commands.kill(handle.pid), "kill answered false");
  await rejects(other.wait(), CommandExitError);
  assert(!(await sbx.commands.kill(handle.pid)), "a second kill found the process");
});

await check("pty: create, input, resize, kill", async () => {
  let output = "";
  const decoder = new TextDecoder();
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (data) => { output += decoder.decode(data); } });
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size\n"));
  await until("24 80", () => output.includes("24 80"));
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 40 });
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size\n"));
  await until("40 100", () => output.includes("40 100"));
  assert(await sbx.pty.kill(pty.pid), "pty kill answered false");
});

await check("files: text, bytes, 20 MiB, list, exists, getInfo, makeDir, rename, remove", async () => {
  await sbx.files.write(path("js/a.txt"), "text");
  assert((await sbx.files.read(path("js/a.txt"))) === "text", "text round trip");
  const big = randomBytes(20 * 1024 * 1024);
  await sbx.files.write(path("js/big.bin"), new Blob([big]));
  const back = Buffer.from(await sbx.files.read(path("js/big.bin"), { format: "bytes" }));
  assert(back.equals(big), `20 MiB round trip (${back.length} bytes back)`);
  const names = (await sbx.files.list(path("js"))).map((e) => e.name).sort();
  assert(JSON.stringify(names) === JSON.stringify(["a.txt", "big.bin"]), JSON.stringify(names));
  assert(await sbx.files.exists(path("js/a.txt")), "exists");
  assert(!(await sbx.files.exists(path("js/none"))), "exists of a missing file");
  const info = await sbx.files.getInfo(path("js/a.txt"));
  assert(info.size === 4 && info.type === "file", JSON.stringify(info));
  assert(await sbx.files.makeDir(path("js/d")), "makeDir");
  await sbx.files.rename(path("js/a.txt"), path("js/d/b.txt"));
  assert(existsSync(path("js/d/b.txt")), "renamed");
  await sbx.files.remove(path("js/d"));
  assert(!existsSync(path("js/d")), "removed");
  await rejects(sbx.files.read(path("js/missing")), NotFoundError);
});

await check("watchDir reports a created file", async () => {
  await sbx.files.makeDir(path("jswatch"));
  const events = [];
  const watch = await sbx.files.watchDir(path("jswatch"), (event) => events.push(event));
  await sbx.files.write(path("jswatch/new.txt"), "n");
  await until("a create event", () =>
    events.some((e) => e.name === "new.txt" && e.type === FilesystemEventType.CREATE));
  await watch.stop();
});

if (failures.length > 0) {
  console.log(`${failures.length} e2b JS SDK checks failed: ${failures.join(", ")}`);
  process.exit(1);
}
console.log("all e2b JS SDK checks passed");
