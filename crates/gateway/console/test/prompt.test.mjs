// A command that waits for input (prompt.js): which command runs, and what it asks, from its
// output and its command line.

import { test } from "node:test";
import assert from "node:assert/strict";

import { applyEvent, createConversation } from "../conversation.js";
import { MAX_PROMPT_CHARS, isSecretPrompt, promptOf, readPromptOf, runningCommand, shellWords, unfinishedLine } from "../prompt.js";

const promptCases = [
  // [output, command line, question]
  ["name? ", "python3 ask.py", "name?"],
  ["Welcome\nPassword: ", "sudo -S true", "Password:"],
  ["Overwrite x.txt? [y/N] ", "cp -i a x.txt", "Overwrite x.txt? [y/N]"],
  ["\x1b[1mContinue?\x1b[0m ", "./setup", "Continue?"],
  ["progress 10%\rprogress 20%\rOK? ", "./run", "OK?"],
  // A finished line asks nothing...
  ["done\n", "make", null],
  ["", "sleep 30", null],
  ["tick1\ntick2\n", "for i in 1 2; do echo tick$i; done", null],
  // ...unless the command line's `read -p` does: bash prints that prompt only on a terminal,
  // and the agent's commands run on pipes.
  ["", "read -p 'name? ' n; echo \"hello $n\"", "name?"],
  ["Setting up\n", "echo Setting up; read -rp \"Your name: \" n", "Your name:"],
  // An unfinished line wins over the command line's prompt.
  ["Pick one (1-3): ", "read -p 'name? ' n", "Pick one (1-3):"],
  ["   \x1b[0m", "true", null],
];
for (const [output, commandLine, question] of promptCases) {
  test(`question of ${JSON.stringify(output)} from ${JSON.stringify(commandLine)}`, () => assert.equal(promptOf(output, commandLine), question));
}

test("a long unfinished line is cut to its end, where the asking is", () => {
  const line = `${"x".repeat(500)} proceed? `;
  const question = promptOf(line, "");
  assert.equal(question.length, MAX_PROMPT_CHARS + 1);
  assert.ok(question.startsWith("…") && question.endsWith("proceed?"));
});

const readCases = [
  ["read -p 'name? ' n; echo \"hello $n\"", "name?"],
  ['read -rp "Go on? " a', "Go on?"],
  ["x=1; read -t 5 -p Name: n", "Name:"],
  ['read -n1 -p "[y/N] " a', "[y/N]"],
  ["read -pfoo", "foo"],
  ['cat list | while read -p "next? " x; do :; done', "next?"],
  ['if true; then read -p "a? " x; fi', "a?"],
  ['x && read -p "and? " y', "and?"],
  ['read -p "say \\"hi\\": " a', 'say "hi":'],
  // the argument of another option is not a prompt
  ["read -d p n", null],
  ["read -a p n", null],
  ["read n", null],
  ["read -r line", null],
  ["echo read -p x", null],
  ["readonly -p", null],
  ["read -p '' n", null],
  ["", null],
];
for (const [commandLine, prompt] of readCases) {
  test(`read prompt of ${JSON.stringify(commandLine)}`, () => assert.equal(readPromptOf(commandLine), prompt));
}

test("shell words: quotes removed, up to the end of the command", () => {
  assert.deepEqual(shellWords(`-p 'a b' "c \\"d\\"" e\\ f; g`), ["-p", "a b", 'c "d"', "e f"]);
  assert.deepEqual(shellWords("x|y"), ["x"]);
  assert.deepEqual(shellWords("  "), []);
});

test("the unfinished line is what the screen shows of it", () => {
  assert.equal(unfinishedLine("a\nb? "), "b?");
  assert.equal(unfinishedLine("a\n"), "");
  assert.equal(unfinishedLine(""), "");
  assert.equal(unfinishedLine("50%\r100%\rsure? "), "sure?");
});

test("secret questions get a password box", () => {
  for (const secret of ["Password:", "[sudo] password for me:", "Enter passphrase for key:", "PIN:", "API token:"]) assert.ok(isSecretPrompt(secret), secret);
  for (const plain of ["name?", "Continue? [y/N]", "Pinned version?"]) assert.ok(!isSecretPrompt(plain), plain);
});

// A turn of the shell agent, as its events come (the shape of fixtures/shell-agent.sse).
let seq = 0;
const event = (type, fields) => ({ seq: ++seq, turn: 1, type, ...fields });
const update = (u) => event("update", { update: u });
const turn = (command) => [
  event("user_message", { text: command }),
  event("turn_start", {}),
  update({ sessionUpdate: "tool_call", toolCallId: "cmd-1", title: command, kind: "execute" }),
  update({ sessionUpdate: "tool_call_update", toolCallId: "cmd-1", status: "in_progress", content: [{ type: "terminal", terminalId: "4242" }] }),
];
const chunk = (text) => update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text } });

function fold(events) {
  const conversation = createConversation();
  for (const e of events) applyEvent(conversation, e);
  return conversation;
}

test("the running command: its terminal, its command line and its output so far", () => {
  const command = "printf 'a\\n'; read -p 'name? ' n; echo \"hello $n\"";
  const conversation = fold([...turn(command), chunk("a"), chunk("\n")]);
  assert.deepEqual(runningCommand(conversation), { toolCallId: "cmd-1", terminalId: "4242", title: command, output: "a\n" });
  assert.equal(promptOf(runningCommand(conversation).output, runningCommand(conversation).title), "name?");
});

test("no running command: before its terminal, once it ended, once the turn ended", () => {
  const started = turn("cat");
  assert.equal(runningCommand(fold(started.slice(0, 3))), null, "no terminal yet");
  const ended = [...started, chunk("x\n"), update({ sessionUpdate: "tool_call_update", toolCallId: "cmd-1", status: "completed", rawOutput: { exit_code: 0 } })];
  assert.equal(runningCommand(fold(ended)), null, "completed");
  const cancelled = [...started, event("turn_end", { stop_reason: "cancelled" })];
  assert.equal(runningCommand(fold(cancelled)), null, "the turn ended");
  assert.equal(runningCommand(createConversation()), null);
});
