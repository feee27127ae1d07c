// How one conversation item (conversation.js) looks: `renderItem(item)` is a pure function to
// `vdom` nodes. Agent text goes through the safe Markdown reader; everything else the agent or a
// command wrote (user text, tool titles, output, file paths, error messages) is only ever text.
// Command output (the shell agent's streamed output, a tool call's text content) is terminal
// text (output.js: monospace, ANSI colours, folded when long, a Copy button), never Markdown.
// Buttons carry `data-*` attributes; chat.js listens for their clicks (output.js for its own):
// a checkpoint's "N files changed" (`data-checkpoint`) opens its changes, a fork's link to its
// source session (`data-session`) opens that session.

import { h } from "./vdom.js";
import { markdown } from "./markdown.js";
import { diffLineClasses, unifiedDiff } from "./diff.js";
import { hostPort } from "./conversation.js";
import { outputBlock, outputKey } from "./output.js";

const TOOL_STATUS = { pending: "pending", in_progress: "running", completed: "done", failed: "failed" };
// A tool call its turn's end stopped (conversation.js), by stop reason; any other reason is "ended".
const TOOL_STOPPED = { cancelled: "cancelled", interrupted: "interrupted" };
const PLAN_MARK = { pending: "○", in_progress: "◐", completed: "●" };

/** The node for one item. `context.sessionTitle(id)`: a session's title, or null when it is not
 *  known (a fork's source). */
export function renderItem(item, context = {}) {
  const attrs = (cls) => ({ class: cls, "data-item": item.id, "data-seq": item.seq });
  switch (item.kind) {
    case "user":
      return h("div", attrs("msg user"), h("p", { class: "plain" }, item.text));
    case "agent":
      // A command's output streamed as agent text (conversation.js, `outputOf`) is terminal text.
      if (item.outputOf) return outputBlock(item.text, { key: outputKey(item.id, item.seq, 0), attrs: attrs("command-output"), preClass: "msg agent" });
      return h("div", attrs("msg agent"), markdown(item.text));
    case "thought":
      return h("details", attrs("thought"), h("summary", {}, "Thought"), h("p", { class: "plain" }, item.text));
    case "tool":
      return renderTool(item, attrs);
    case "plan":
      return h(
        "div",
        attrs("plan"),
        h("p", { class: "label" }, "Plan"),
        h("ol", {}, item.entries.map((entry) => h("li", { class: `plan-${entry.status}` }, h("span", { "aria-hidden": "true" }, PLAN_MARK[entry.status] ?? "○"), " ", entry.content ?? ""))),
      );
    case "permission":
      return renderPermission(item, attrs);
    case "egress_request":
      return renderEgressRequest(item, attrs);
    case "refused":
      return h("p", attrs("note refused"), item.text);
    case "credential":
      return renderCredentialUse(item, attrs);
    case "error":
      return h("p", attrs("error"), h("strong", {}, "Error"), ` ${item.message} (${item.code})`);
    case "note":
      return h("p", attrs(item.text === "cancelled" ? "note cancelled" : "note"), item.text);
    case "checkpoint":
      return renderCheckpoint(item, attrs);
    case "forked":
      return renderForked(item, attrs, context.sessionTitle?.(item.sourceSession) ?? null);
    case "rewound":
      return renderRewound(item, attrs);
    default:
      return h("p", attrs("note"), "");
  }
}

/** A tool call's state in words and as the class that styles it: its ACP status, or how its
 *  turn's end stopped it ("cancelled", class `tool-cancelled`; else class `tool-ended`). */
export function toolState(item) {
  if (item.stopped) {
    return { words: TOOL_STOPPED[item.stopped] ?? "ended", cls: item.stopped === "cancelled" ? "tool-cancelled" : "tool-ended" };
  }
  return { words: TOOL_STATUS[item.status] ?? item.status, cls: `tool-${item.status}` };
}

function renderTool(item, attrs) {
  const state = toolState(item);
  const status = state.words;
  const exit = item.rawOutput && typeof item.rawOutput.exit_code === "number" && item.rawOutput.exit_code !== 0 ? ` (exit ${item.rawOutput.exit_code})` : "";
  const running = !item.stopped && (item.status === "in_progress" || item.status === "pending");
  return h(
    "div",
    attrs(`tool ${state.cls}`),
    h(
      "p",
      { class: "tool-head" },
      h("span", { class: "tool-kind" }, item.toolKind),
      " ",
      h("code", { class: "tool-title" }, item.title),
      " ",
      h("span", { class: "tool-status" }, status + exit),
    ),
    renderToolContents(item, running),
  );
}

/** The nodes of a tool call's `content`, its text outputs numbered for their fold (output.js). */
function renderToolContents(item, running) {
  let outputs = 0;
  return item.content.map((content) => {
    const key = content?.type === "content" && content.content?.type === "text" ? outputKey(item.id, item.seq, outputs++) : undefined;
    return renderToolContent(content, running, key);
  });
}

/** A tool's text output as terminal text: an output that is one fenced code block (an agent
 *  wrapping a command's output in ```` ```console ````) shows what is inside the fence. */
export function toolOutputText(text) {
  const fenced = /^\s*(`{3,}|~{3,})[^\n`]*\n([\s\S]*?)\n?\1\s*$/.exec(text);
  return fenced && !fenced[2].includes(fenced[1]) ? fenced[2] : text;
}

/** The node for one entry of a tool call's `content`; a terminal is offered only while it runs.
 *  `key` remembers a text output's fold (output.js). */
export function renderToolContent(content, running = false, key = undefined) {
  switch (content?.type) {
    case "diff": {
      const lines = unifiedDiff(content.path, content.oldText, content.newText);
      const classes = diffLineClasses(lines);
      return h(
        "pre",
        { class: "diff", "aria-label": `Changes to ${content.path}` },
        lines.map((line, n) => h("span", { class: classes[n] }, line + "\n")),
      );
    }
    case "terminal":
      // The command's output also streams as agent text; once it ended there is nothing to watch.
      if (!running) return null;
      return h(
        "p",
        { class: "tool-terminal" },
        "running in terminal ",
        h("code", {}, `term-${content.terminalId}`),
        h("button", { type: "button", class: "small", "data-terminal-id": `term-${content.terminalId}` }, "Watch"),
      );
    case "content":
      return content.content?.type === "text"
        ? outputBlock(toolOutputText(content.content.text ?? ""), { key, preClass: "output" })
        : h("p", { class: "note" }, `[${content.content?.type ?? "content"}]`);
    default:
      return h("p", { class: "note" }, `[${content?.type ?? "content"}]`);
  }
}

/** "1 file changed", "3 files changed". */
export function filesChangedWords(n) {
  return n === 1 ? "1 file changed" : `${n} files changed`;
}

// What a checkpoint taken for another reason than a turn's end says before its files changed.
const CHECKPOINT_REASON = { rewind: "Before the rewind", pause: "Sandbox paused", files: "Your file changes" };

/** A checkpoint's line: "N files changed" as a button that opens its changes. */
function renderCheckpoint(item, attrs) {
  const reason = item.reason === "turn" ? null : (CHECKPOINT_REASON[item.reason] ?? `Checkpoint (${item.reason})`);
  return h(
    "p",
    attrs(reason ? "checkpoint-line note" : "checkpoint-line"),
    reason ? `${reason} · ` : null,
    h("button", { type: "button", class: "small checkpoint-changes", "data-checkpoint": item.checkpointId, title: "Show the changes of this checkpoint" }, filesChangedWords(item.filesChanged)),
  );
}

/** A rewind's line: the checkpoint the workspace became (by its turn when known), and that what
 *  it held before was kept. */
function renderRewound(item, attrs) {
  const turn = item.checkpointTurn;
  return h(
    "p",
    attrs("note rewound"),
    "Workspace rewound to ",
    turn === null ? ["checkpoint ", h("code", { title: item.checkpointId }, shortCheckpointId(item.checkpointId))] : turn > 0 ? `turn ${turn}` : "before the first turn",
    item.savedId ? "; what it held before is kept as a checkpoint" : null,
    item.restart ? ". The agent was restarted." : ".",
  );
}

/** A checkpoint id, short enough for a line ("ck_1a2b3c4d5e…"); the whole id is its title. */
export function shortCheckpointId(id) {
  return id.length > 14 ? `${id.slice(0, 12)}…` : id;
}

/** A fork's first line: "Forked from <source session> at checkpoint <id>", the session a link. */
function renderForked(item, attrs, title) {
  const name = title ?? `session ${item.sourceSession.slice(0, 8)}`;
  return h(
    "p",
    attrs("note forked"),
    "Forked from ",
    h("a", { href: `/#/s/${encodeURIComponent(item.sourceSession)}`, "data-session": item.sourceSession }, name),
    " at checkpoint ",
    h("code", { title: item.checkpointId }, shortCheckpointId(item.checkpointId)),
  );
}

function renderPermission(item, attrs) {
  const title = item.toolCall.title ?? item.toolCall.toolCallId ?? "a tool call";
  let answer;
  if (!item.resolved) {
    answer = h(
      "div",
      { class: "options" },
      item.options.map((option) =>
        h("button", { type: "button", class: `option option-${option.kind}`, "data-request-id": item.requestId, "data-option-id": option.optionId }, option.name ?? option.optionId),
      ),
    );
  } else if (item.resolved.outcome === "selected") {
    const chosen = item.options.find((option) => option.optionId === item.resolved.optionId);
    answer = h("p", { class: "answer" }, `Answered: ${chosen?.name ?? item.resolved.optionId}`);
  } else {
    answer = h("p", { class: "answer" }, "No longer asked (the turn ended)");
  }
  return h(
    "div",
    { ...attrs(item.resolved ? "permission resolved" : "permission"), role: "group", "aria-label": "Permission request", "data-request-id": item.requestId },
    h("p", { class: "label" }, "The agent asks to run"),
    h("pre", { class: "output" }, title),
    answer,
  );
}

// The answers to a network request, as buttons and, once chosen, as what happened.
const EGRESS_OPTIONS = {
  allow_once: { button: "Allow once", done: "Allowed once" },
  allow_session: { button: "Allow for this session", done: "Allowed for this session" },
  deny: { button: "Deny", done: "Denied" },
};

/** What a resolved network request came to, in words ("Allowed once", "Denied", ...). */
export function egressOutcomeWords(resolved) {
  if (resolved.outcome === "selected") return EGRESS_OPTIONS[resolved.optionId]?.done ?? `Answered: ${resolved.optionId}`;
  if (resolved.outcome === "timed_out") return "Refused: no answer in time";
  return "Cancelled";
}

function renderEgressRequest(item, attrs) {
  let answer;
  if (!item.resolved) {
    answer = h(
      "div",
      { class: "options" },
      item.options.map((option) =>
        h("button", { type: "button", class: `option option-${option}`, "data-request-id": item.requestId, "data-option-id": option }, EGRESS_OPTIONS[option]?.button ?? option),
      ),
    );
  } else {
    const refused = item.resolved.outcome !== "selected" || item.resolved.optionId === "deny";
    answer = h("p", { class: refused ? "answer refused" : "answer" }, egressOutcomeWords(item.resolved));
  }
  return h(
    "div",
    { ...attrs(item.resolved ? "permission egress resolved" : "permission egress"), role: "group", "aria-label": "Network permission request", "data-request-id": item.requestId },
    h("p", { class: "label" }, "Network"),
    h("p", { class: "ask" }, "The sandbox wants to reach ", h("strong", {}, hostPort(item.host, item.port))),
    item.resolved ? null : h("p", { class: "meta" }, "The connection waits for your answer; without one it is refused."),
    answer,
  );
}

/** A credential use in words: "github · POST api.github.com/repos/o/r/pulls → 201", with "×3"
 *  after it for three uses in a row. */
export function credentialWords(item) {
  const status = item.status === null || item.status === undefined ? "" : ` → ${item.status}`;
  const count = item.count > 1 ? ` ×${item.count}` : "";
  return `${item.name} · ${item.method} ${item.host}${item.path}${status}${count}`;
}

/** A credential use as a quiet one-line note; a refused request (status 400 and up) in the
 *  failure colour. The request shrinks to an ellipsis on a narrow screen while the name, the
 *  status and the count stay; the whole line is the title. */
function renderCredentialUse(item, attrs) {
  const failed = typeof item.status === "number" && item.status >= 400;
  return h(
    "p",
    { ...attrs(failed ? "note credential failed" : "note credential"), title: credentialWords(item) },
    h("span", { class: "credential-key", "aria-hidden": "true" }, "🔑"),
    " ",
    h("span", { class: "credential-name" }, item.name),
    " · ",
    h("span", { class: "credential-method" }, item.method),
    " ",
    h("span", { class: "credential-target" }, item.host + item.path),
    item.status === null || item.status === undefined ? null : [" → ", h("span", { class: "credential-status" }, String(item.status))],
    item.count > 1 ? [" ", h("span", { class: "credential-count" }, `×${item.count}`)] : null,
  );
}

const BRAIN_WORDS = { none: "not started", warm: "warm", ready: "ready", starting: "starting", idle: "idle" };

/** A hands state (`none`, `running`, `paused`, ...) in words. */
export function handsWords(hands) {
  return hands === "none" ? "not started" : hands ?? "unknown";
}

/** The state of a session object in words: "idle · agent ready · hands running · sandboxed (bwrap)". */
export function stateWords(session) {
  const parts = [session.status === "running" ? "working" : "idle"];
  parts.push(`agent ${BRAIN_WORDS[session.brain] ?? session.brain ?? "unknown"}`);
  parts.push(`hands ${handsWords(session.hands)}`);
  if (session.isolation === "bwrap") parts.push("sandboxed (bwrap)");
  else if (session.isolation === "remote") parts.push("remote hands");
  else if (session.isolation === "none") parts.push("no isolation");
  return parts.join(" · ");
}
