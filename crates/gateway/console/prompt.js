// A command that waits for input, as the conversation shows it (pure, no DOM): the agent's
// command running in a terminal now (`runningCommand`) and the question it asks (`promptOf`).
//
// A command asks when it is still running, the last line of its output does not end in a
// newline (`name? `, `Password: `, `[y/N] `), and nothing new arrived for QUIET_MS (chat.js
// keeps the time). A command on pipes may ask without printing anything: bash's `read -p
// PROMPT` prints PROMPT only when its input is a terminal, and the agent's commands run on
// pipes, so for a command with no unfinished line the question is the `read -p` prompt of its
// command line, when it has one. Nothing here can tell a command that reads its input from one
// that prints a line in pieces and pauses: the question then shows until the line goes on.

import { ansiLines } from "./ansi.js";

/** How long a command's output stays unchanged before its unfinished last line is a question. */
export const QUIET_MS = 1000;
/** The longest question shown (its end, where the asking is). */
export const MAX_PROMPT_CHARS = 200;

/** The agent's command running in a terminal now: `{toolCallId, terminalId, title, output}`
 *  (its output as the conversation has it so far), or null when none runs. */
export function runningCommand(conversation) {
  if (!conversation.running) return null;
  let tool = null;
  for (const item of conversation.turnTools) {
    if ((item.status === "in_progress" || item.status === "pending") && !item.stopped) {
      const terminal = item.content.find((c) => c?.type === "terminal" && c.terminalId);
      if (terminal) tool = { item, terminalId: String(terminal.terminalId) };
    }
  }
  if (!tool) return null;
  let output = "";
  for (const item of conversation.items) {
    if (item.kind === "agent" && item.outputOf === tool.item.toolCallId) output += item.text;
  }
  return { toolCallId: tool.item.toolCallId, terminalId: tool.terminalId, title: tool.item.title ?? "", output };
}

/** The text of the output's unfinished last line, as shown (escapes dropped, `\r` redraws
 *  folded), trimmed; "" when the output ends with a newline. */
export function unfinishedLine(output) {
  if (output === "" || output.endsWith("\n")) return "";
  const last = ansiLines(output).at(-1) ?? [];
  return last
    .map((run) => run.text)
    .join("")
    .trim();
}

/** The words of a shell command line up to its first `;`, `&`, `|`, `)` or newline, quotes
 *  removed (`'a b'`, `"a \"b\""`); enough to read a command's options. */
export function shellWords(line) {
  const words = [];
  let word = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (";&|)\n".includes(c)) break;
    if (/\s/.test(c)) {
      if (word !== null) words.push(word);
      word = null;
    } else if (c === "'") {
      const end = line.indexOf("'", i + 1);
      word = (word ?? "") + line.slice(i + 1, end === -1 ? line.length : end);
      i = end === -1 ? line.length : end;
    } else if (c === '"') {
      word = word ?? "";
      for (i++; i < line.length && line[i] !== '"'; i++) word += line[i] === "\\" && i + 1 < line.length ? line[++i] : line[i];
    } else {
      word = (word ?? "") + (c === "\\" && i + 1 < line.length ? line[++i] : c);
    }
  }
  if (word !== null) words.push(word);
  return words;
}

// bash `read` options that take an argument: the rest of their cluster, or the next word.
const READ_ARGUMENT_OPTIONS = "adinNptu";

/** The prompt of the first `read -p PROMPT` in a shell command line (`read -rp 'Name: ' n`,
 *  `x=1; read -p "Go on? " a`), or null. */
export function readPromptOf(commandLine) {
  const line = String(commandLine ?? "");
  // `read` where a command starts: first, after `;`, `&`, `|`, `(`, `{` or a keyword (`then`, `while`).
  for (const found of line.matchAll(/(?:^|[;&|({]|\b(?:then|do|else|while|until|if)\s)\s*read(?=\s)/g)) {
    const words = shellWords(line.slice(found.index + found[0].length));
    for (let w = 0; w < words.length && words[w].startsWith("-") && words[w] !== "--"; w++) {
      const letters = words[w].slice(1);
      for (let l = 0; l < letters.length; l++) {
        if (!READ_ARGUMENT_OPTIONS.includes(letters[l])) continue;
        const argument = l + 1 < letters.length ? letters.slice(l + 1) : words[++w];
        if (letters[l] === "p") return argument && argument.trim() !== "" ? argument.trim() : null;
        break;
      }
    }
  }
  return null;
}

/** The question a running command asks, from its output and command line, or null. */
export function promptOf(output, commandLine) {
  const line = unfinishedLine(output);
  const prompt = line !== "" ? line : readPromptOf(commandLine);
  if (!prompt) return null;
  return prompt.length > MAX_PROMPT_CHARS ? `…${prompt.slice(-MAX_PROMPT_CHARS)}` : prompt;
}

/** Whether the answer to `prompt` is a secret, to be typed in a password box. */
export function isSecretPrompt(prompt) {
  return /pass(word|phrase)|\bpin\b|token|secret/i.test(prompt ?? "");
}
