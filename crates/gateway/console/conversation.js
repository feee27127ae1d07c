// The conversation as data: `applyEvent(conversation, event)` folds one event of the session's
// stream (docs/gateway.md, "Events") into a list of items (a user message, one streamed agent
// message, a thought, a tool call, a plan, a permission request, a network request, a quiet
// line, an error) and returns the items it created or changed, so the view re-renders only
// those. No DOM here.
//
// Rules worth knowing:
// - An event whose seq is not above the last one applied is a replay and changes nothing.
// - Agent text chunks join the open agent message; any new item (a tool call, a user message,
//   the end of the turn) closes it. Updates to earlier items (a tool call's status) do not, so a
//   command's output stays one message while its tool call completes.
// - Agent text that comes while a tool call of the turn runs in a terminal (status pending or
//   in_progress, a `terminal` in its content) is that command's output, not prose: the built-in
//   shell agent streams what `terminal/output` gives as agent message chunks. Such a message has
//   `outputOf` (the tool call's id; null for prose) and is shown as terminal text (render.js);
//   prose and output never share a message.
// - `tool_call_update` merges into the tool call with that id (its `content`, when present,
//   replaces the old one, as ACP says); a plan replaces the turn's previous plan.
// - A tool call cannot outlive its turn: one still pending or running at `turn_end` is marked
//   `stopped` with the stop reason (shown "cancelled", "interrupted" or "ended", never
//   "running"). ACP has no "cancelled" status, so an agent reports the command it killed on a
//   cancel as `failed`: in a turn that ends `cancelled`, the tool calls that failed without an
//   exit code right before the end (nothing else from the agent after them) are the cancelled
//   ones. A later `completed` update still wins.
// - An `egress_request` (a command in the hands wants to reach a host no rule covers) is asked
//   like a permission and closed by the same `permission_resolved`, but it belongs to no turn
//   (the person's own terminal may have made the connection), so the end of a turn leaves it
//   open. Of the `egress` events only a refused destination is a (quiet) line, once per turn;
//   allowed ones and byte summaries belong to the Network view (network.js).
// - A `credential_used` (the egress proxy set a credential on a request) is a quiet line too;
//   uses of the same credential, host, method, path and status one after the other in the chat
//   fold into one line with a count (a `git push` makes several requests).
// - A `checkpoint` (the workspace kept after a turn that used the sandbox) is a line with its
//   number of files changed, at the end of its turn: one that comes once the next turn has begun
//   goes before that turn's first item (`before`: the id of the item it is shown before), and it
//   closes nothing that streams. None when no file changed, nor for a fork's first checkpoint
//   (the `forked` line says it). A `forked` event (a new session's first, made from another
//   session's checkpoint) is a line naming the source session and checkpoint; `rewound` (the
//   workspace became a checkpoint's) a quiet line naming it by its turn when its `checkpoint`
//   event was seen.
// - Every item carries the `turn` of the event that made it (null outside turns).

/** A new, empty conversation. */
export function createConversation() {
  return {
    items: [],
    lastSeq: 0,
    running: false,
    openAgent: null,
    openThought: null,
    tools: new Map(),
    permissions: new Map(), // request id → permission or egress request item
    refused: new Set(), // "turn|host:port|rule" of the refused destinations already said
    plan: null,
    eventTurn: null, // the turn of the event being applied
    checkpointTurns: new Map(), // checkpoint id → the turn it follows, from its event
    turnTools: new Set(), // tool calls seen since the turn started
    tailFailed: [], // tool calls that failed after the agent's last other word in this turn
    nextId: 1,
  };
}

function add(conversation, item) {
  conversation.openAgent = null;
  conversation.openThought = null;
  item.id = conversation.nextId++;
  item.turn ??= conversation.eventTurn;
  conversation.items.push(item);
  return item;
}

function note(conversation, event, text) {
  return [add(conversation, { kind: "note", seq: event.seq, text })];
}

/** Applies `event`; returns the items created or changed (empty for a replayed seq). */
export function applyEvent(conversation, event) {
  if (typeof event.seq === "number") {
    if (event.seq <= conversation.lastSeq) return [];
    conversation.lastSeq = event.seq;
  }
  conversation.eventTurn = typeof event.turn === "number" ? event.turn : null;
  if (movesOn(event)) conversation.tailFailed = [];
  switch (event.type) {
    case "user_message":
      return [add(conversation, { kind: "user", seq: event.seq, text: event.text ?? "" })];
    case "turn_start":
      conversation.running = true;
      conversation.plan = null;
      conversation.turnTools = new Set();
      return [];
    case "update":
      return applyUpdate(conversation, event, event.update ?? {});
    case "permission_request": {
      const item = add(conversation, {
        kind: "permission",
        seq: event.seq,
        requestId: event.request_id,
        toolCall: event.tool_call ?? {},
        options: event.options ?? [],
        resolved: null,
      });
      conversation.permissions.set(event.request_id, item);
      return [item];
    }
    case "egress_request": {
      const item = add(conversation, {
        kind: "egress_request",
        seq: event.seq,
        requestId: event.request_id,
        host: event.host ?? "",
        port: event.port ?? null,
        options: event.options ?? [],
        resolved: null,
      });
      conversation.permissions.set(event.request_id, item);
      return [item];
    }
    case "egress":
      return applyEgress(conversation, event);
    case "credential_used":
      return applyCredentialUsed(conversation, event);
    case "permission_resolved": {
      const item = conversation.permissions.get(event.request_id);
      if (!item) return [];
      item.resolved = { outcome: event.outcome, optionId: event.option_id ?? null };
      return [item];
    }
    case "turn_end":
      return turnEnd(conversation, event);
    case "status":
      return note(conversation, event, statusWords(event));
    case "hands":
      return note(conversation, event, handsWords(event));
    case "error":
      return [add(conversation, { kind: "error", seq: event.seq, code: event.code ?? "ERROR", message: event.message ?? "" })];
    case "gap":
      return note(conversation, event, `Earlier events were compacted: ${event.after + 1}–${event.next_seq - 1} are not shown.`);
    case "checkpoint":
      return applyCheckpoint(conversation, event);
    case "forked":
      return [add(conversation, { kind: "forked", seq: event.seq, sourceSession: idOf(event.source_session), checkpointId: idOf(event.checkpoint) })];
    case "rewound":
      return [add(conversation, { kind: "rewound", seq: event.seq, checkpointId: idOf(event.checkpoint), checkpointTurn: conversation.checkpointTurns.get(idOf(event.checkpoint)) ?? null, savedId: idOf(event.saved), restart: Boolean(event.restart) })];
    default:
      // files_changed, usage and types added later change nothing in the conversation.
      return [];
  }
}

/** Whether `event` is the agent (or the person) moving on, after which a failure is no longer
 *  the last thing the turn did: anything of the conversation but quiet bookkeeping. */
function movesOn(event) {
  if (event.type === "update") return event.update?.sessionUpdate !== "tool_call_update";
  return ["user_message", "turn_start", "permission_request"].includes(event.type);
}

const hasExitCode = (tool) => typeof tool.rawOutput?.exit_code === "number";

/** The tool calls a turn's end leaves stopped (see the rules above), marked and returned. */
function stopTools(conversation, event) {
  const reason = String(event.stop_reason ?? "ended");
  const stopped = [];
  for (const item of conversation.turnTools) {
    if (item.status === "pending" || item.status === "in_progress") {
      item.stopped = reason;
      stopped.push(item);
    }
  }
  if (reason === "cancelled") {
    for (const item of conversation.tailFailed) {
      if (item.status === "failed" && !hasExitCode(item) && !item.stopped) {
        item.stopped = reason;
        stopped.push(item);
      }
    }
  }
  conversation.turnTools = new Set();
  conversation.tailFailed = [];
  return stopped;
}

function turnEnd(conversation, event) {
  conversation.running = false;
  conversation.openAgent = null;
  conversation.openThought = null;
  const stopped = stopTools(conversation, event);
  const words = {
    cancelled: "cancelled",
    interrupted: "interrupted (the gateway restarted or its storage failed)",
    error: "the turn ended with an error",
    max_tokens: "stopped: the agent reached its token limit",
    max_turn_requests: "stopped: the agent reached its request limit",
    refusal: "the agent refused",
  }[event.stop_reason];
  const changed = [...stopped, ...(words ? note(conversation, event, words) : [])];
  // An agent's request left open is moot once the turn is over; a network request is not (its
  // connection may come from the person's terminal, outside any turn).
  for (const item of conversation.permissions.values()) {
    if (item.kind === "permission" && !item.resolved) {
      item.resolved = { outcome: "cancelled", optionId: null };
      changed.push(item);
    }
  }
  return changed;
}

/** A refused destination becomes one quiet line per turn; anything else about egress, none. */
function applyEgress(conversation, event) {
  if (event.decision !== "refused") return [];
  const key = `${event.turn ?? ""}|${hostPort(event.host, event.port)}|${event.rule ?? ""}`;
  if (conversation.refused.has(key)) return [];
  conversation.refused.add(key);
  return [add(conversation, { kind: "refused", seq: event.seq, host: event.host ?? "", port: event.port ?? null, rule: event.rule ?? null, text: refusedWords(event) })];
}

/** A request that carried a credential: a new quiet line, or one more use on the line just
 *  before when it is the same credential, host, method, path and status. */
function applyCredentialUsed(conversation, event) {
  const use = {
    name: String(event.name ?? ""),
    host: String(event.host ?? ""),
    method: String(event.method ?? ""),
    // The gateway sends the path without its query; never show one if it did not.
    path: String(event.path ?? "").split(/[?#]/)[0],
    status: typeof event.status === "number" ? event.status : null,
  };
  const last = conversation.items.at(-1);
  if (last?.kind === "credential" && ["name", "host", "method", "path", "status"].every((k) => last[k] === use[k])) {
    last.count++;
    return [last];
  }
  return [add(conversation, { kind: "credential", seq: event.seq, ...use, count: 1 })];
}

/** A checkpoint's line, placed at the end of its turn (see the rules above); none when it
 *  changed no file, or starts a fork. */
function applyCheckpoint(conversation, event) {
  const filesChanged = Math.max(0, Number(event.files_changed) || 0);
  const reason = String(event.reason ?? "turn");
  conversation.checkpointTurns.set(String(event.id ?? ""), conversation.eventTurn);
  if (filesChanged === 0 || reason === "fork") return [];
  const item = { kind: "checkpoint", seq: event.seq, checkpointId: String(event.id ?? ""), turn: conversation.eventTurn, filesChanged, reason };
  const items = conversation.items;
  let at = items.length;
  if (item.turn !== null) while (at > 0 && typeof items[at - 1].turn === "number" && items[at - 1].turn > item.turn) at--;
  if (at === items.length) return [add(conversation, item)];
  // Late: before the next turn's first item, the open message left open.
  item.id = conversation.nextId++;
  item.before = items[at].id;
  items.splice(at, 0, item);
  return [item];
}

/** An id the gateway sends as a string, or as an object with an `id`. */
function idOf(value) {
  return String((value !== null && typeof value === "object" ? value.id : value) ?? "");
}

/** `host:port`, with an IPv6 address in brackets (`[::1]:443`); the host alone without a port. */
export function hostPort(host, port) {
  const name = String(host ?? "");
  const shown = name.includes(":") && !name.startsWith("[") ? `[${name}]` : name;
  return port === null || port === undefined || port === "" ? shown : `${shown}:${port}`;
}

/** The quiet line for a refused destination: "Refused files.example.com:443 (deny *.example.com)". */
export function refusedWords(event) {
  return `Refused ${hostPort(event.host, event.port)}${event.rule ? ` (${event.rule})` : ""}`;
}

function applyUpdate(conversation, event, update) {
  switch (update.sessionUpdate) {
    case "agent_message_chunk":
    case "user_message_chunk": {
      const text = contentText(update.content);
      const kind = update.sessionUpdate === "agent_message_chunk" ? "agent" : "user";
      const outputOf = kind === "agent" ? (runningTerminalTool(conversation)?.toolCallId ?? null) : null;
      if (kind === "agent" && conversation.openAgent?.outputOf === outputOf) {
        conversation.openAgent.text += text;
        return [conversation.openAgent];
      }
      const item = add(conversation, kind === "agent" ? { kind, seq: event.seq, text, outputOf } : { kind, seq: event.seq, text });
      if (kind === "agent") conversation.openAgent = item;
      return [item];
    }
    case "agent_thought_chunk": {
      const text = contentText(update.content);
      if (conversation.openThought) {
        conversation.openThought.text += text;
        return [conversation.openThought];
      }
      const item = add(conversation, { kind: "thought", seq: event.seq, text });
      conversation.openThought = item;
      return [item];
    }
    case "tool_call":
    case "tool_call_update": {
      let item = conversation.tools.get(update.toolCallId);
      if (!item) {
        item = add(conversation, { kind: "tool", seq: event.seq, toolCallId: update.toolCallId, title: "", toolKind: "other", status: "pending", content: [], rawOutput: null });
        conversation.tools.set(update.toolCallId, item);
      }
      conversation.turnTools.add(item);
      if (update.title !== undefined && update.title !== null) item.title = update.title;
      if (update.kind) item.toolKind = update.kind;
      if (update.status) item.status = update.status;
      if (update.status === "completed") delete item.stopped;
      if (update.status === "failed") conversation.tailFailed.push(item);
      if (Array.isArray(update.content)) item.content = update.content;
      if (update.rawOutput !== undefined) item.rawOutput = update.rawOutput;
      return [item];
    }
    case "plan": {
      const entries = update.entries ?? [];
      if (conversation.plan) {
        conversation.plan.entries = entries;
        return [conversation.plan];
      }
      conversation.plan = add(conversation, { kind: "plan", seq: event.seq, entries });
      return [conversation.plan];
    }
    default:
      // available_commands_update, current_mode_update and the like are not conversation.
      return [];
  }
}

/** The turn's latest tool call still running in a terminal (its output is streamed as agent
 *  text), or undefined. */
function runningTerminalTool(conversation) {
  let found;
  for (const item of conversation.turnTools) {
    if ((item.status === "in_progress" || item.status === "pending") && !item.stopped && item.content.some((c) => c?.type === "terminal")) found = item;
  }
  return found;
}

/** The text of an ACP content block; other kinds become a short placeholder. */
export function contentText(content) {
  if (!content) return "";
  if (content.type === "text") return content.text ?? "";
  if (content.type === "resource_link") return `[${content.name ?? content.uri ?? "resource"}]`;
  return `[${content.type ?? "content"}]`;
}

function statusWords(event) {
  const brain = { starting: "starting", ready: "ready", idle: "idle" }[event.brain] ?? String(event.brain ?? "");
  return `agent ${brain}${event.message ? `: ${event.message}` : ""}`;
}

function handsWords(event) {
  const parts = [`hands ${event.state}`];
  const details = [];
  if (event.isolation) details.push(event.isolation === "none" ? "no isolation" : event.isolation);
  if (typeof event.elapsed_ms === "number" && event.elapsed_ms > 0) details.push(`${event.elapsed_ms} ms`);
  if (event.reset) details.push("reset");
  if (details.length) parts.push(`(${details.join(", ")})`);
  const why = event.error || event.message;
  return parts.join(" ") + (why ? `: ${why}` : "");
}
