// The Chat view: the conversation log rebuilt from the session's event stream, the message box,
// the Cancel button and the answers to the agent's permission requests and the sandbox's network
// requests (one route for both). Events are folded into the conversation (conversation.js) as
// they come; the items they changed are re-rendered (render.js) once per animation frame, so a
// history of thousands of events costs one layout, not thousands. The message box's draft is
// kept in localStorage per session: a reconnect, a reload or a failed send never loses it.

import { EventStream, withQuery } from "./api.js";
import { applyEvent, createConversation, hostPort } from "./conversation.js";
import { renderItem } from "./render.js";
import { toDom } from "./vdom.js";

const draftKey = (sessionId) => `warren.draft.${sessionId}`;

export class ChatView {
  /**
   * `elements`: log, form, message, cancel, error; `api`; `onEvent(event, live)` for the other
   * views; `onStatus(status)` for the connection; `onWatch(terminalName)` for a tool's terminal.
   */
  constructor({ elements, api, onEvent, onStatus, onWatch }) {
    this.el = elements;
    this.api = api;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.session = null;
    this.stream = null;
    this.conversation = createConversation();
    this.nodes = new Map(); // item id → its element in the log
    this.pending = new Map(); // item id → item, to render at the next frame
    this.frame = null;
    this.historyUntil = 0; // the session's last seq when it was opened
    this.historyShown = false;

    this.el.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.el.message.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    this.el.message.addEventListener("input", () => {
      if (this.session) localStorage.setItem(draftKey(this.session.id), this.el.message.value);
    });
    this.el.cancel.addEventListener("click", () => this.cancel());
    this.el.log.addEventListener("click", (event) => {
      const option = event.target.closest("button[data-option-id]");
      if (option) this.answer(option);
      const watch = event.target.closest("button[data-terminal-id]");
      if (watch) onWatch(watch.dataset.terminalId);
    });
    window.addEventListener("offline", () => this.stream?.drop());
    window.addEventListener("online", () => this.stream?.reconnectNow());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) {
        this.stream?.reconnectNow();
        this.scheduleFlush();
      }
    });
  }

  /** Shows `session`'s conversation and follows its events. */
  open(session) {
    this.close();
    this.session = session;
    this.conversation = createConversation();
    this.nodes.clear();
    this.pending.clear();
    this.el.log.replaceChildren();
    this.el.log.setAttribute("aria-busy", "true");
    this.historyUntil = session.last_seq ?? 0;
    this.historyShown = false;
    this.el.message.value = localStorage.getItem(draftKey(session.id)) ?? "";
    this.showError("");
    this.updateControls();
    const token = this.api.token;
    this.stream = new EventStream({
      url: (after) => withQuery(`/v1/sessions/${encodeURIComponent(session.id)}/events`, { access_token: token, after }),
      onEvent: (event) => this.receive(event),
      onStatus: (status) => this.onStatus(status),
    });
    this.stream.start(0);
    if (this.historyUntil === 0) this.scheduleFlush();
  }

  /** The Chat view opened: the log was hidden, so it could not follow the newest events. */
  show() {
    this.el.log.scrollTop = this.el.log.scrollHeight;
  }

  hide() {}

  close() {
    this.stream?.stop();
    this.stream = null;
    this.session = null;
  }

  receive(event) {
    const live = event.seq > this.historyUntil;
    for (const item of applyEvent(this.conversation, event)) this.pending.set(item.id, item);
    this.scheduleFlush();
    this.onEvent(event, live);
    if (live) notify(event, this.session);
  }

  scheduleFlush() {
    if (this.frame !== null) return;
    // Hidden tabs get no animation frames; render there at a slower pace instead.
    const later = document.hidden ? (f) => setTimeout(f, 500) : requestAnimationFrame;
    this.frame = later(() => {
      this.frame = null;
      this.flush();
    });
  }

  flush() {
    const log = this.el.log;
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
    const appended = document.createDocumentFragment();
    for (const item of this.pending.values()) {
      const node = toDom(renderItem(item), document);
      const old = this.nodes.get(item.id);
      if (old) {
        // A thought the person unfolded stays unfolded while it streams.
        if (old.tagName === "DETAILS" && old.open) node.open = true;
        old.replaceWith(node);
      } else {
        appended.append(node);
      }
      this.nodes.set(item.id, node);
    }
    this.pending.clear();
    log.append(appended);
    if (atBottom || !this.historyShown) log.scrollTop = log.scrollHeight;
    this.updateControls();
    if (!this.historyShown && this.conversation.lastSeq >= this.historyUntil) {
      this.historyShown = true;
      log.removeAttribute("aria-busy");
      // The time from navigation to the whole history on screen (read by the browser tests).
      performance.mark("warren:conversation-rendered");
    }
  }

  updateControls() {
    this.el.cancel.disabled = !this.conversation.running;
  }

  async send() {
    if (!this.session) return;
    const text = this.el.message.value;
    if (text.trim() === "") return;
    askNotificationPermission();
    const sessionId = this.session.id;
    try {
      await this.api.request("POST", `/v1/sessions/${sessionId}/messages`, { json: { text } });
    } catch (error) {
      this.showError(error.code === "TURN_IN_PROGRESS" ? "The agent is still working: wait, or Cancel the turn." : `Not sent: ${error.message}`);
      return;
    }
    this.showError("");
    // Only clear what was sent: the person may have typed on while the request was out.
    if (this.session?.id === sessionId && this.el.message.value === text) {
      this.el.message.value = "";
      localStorage.removeItem(draftKey(sessionId));
    }
  }

  async cancel() {
    if (!this.session) return;
    try {
      await this.api.request("POST", `/v1/sessions/${this.session.id}/cancel`);
    } catch (error) {
      if (error.code !== "NO_TURN_RUNNING") this.showError(`Cancel failed: ${error.message}`);
    }
  }

  async answer(button) {
    const group = button.closest('[role="group"]');
    const buttons = group ? [...group.querySelectorAll("button")] : [button];
    for (const b of buttons) b.disabled = true;
    try {
      await this.api.request("POST", `/v1/sessions/${this.session.id}/permissions/${encodeURIComponent(button.dataset.requestId)}`, {
        json: { option_id: button.dataset.optionId },
      });
    } catch (error) {
      // Answered elsewhere meanwhile: the permission_resolved event will say so.
      if (error.code === "PERMISSION_NOT_FOUND") return;
      for (const b of buttons) b.disabled = false;
      this.showError(`Not answered: ${error.message}`);
    }
  }

  showError(text) {
    this.el.error.textContent = text;
    this.el.error.hidden = text === "";
  }
}

function askNotificationPermission() {
  if ("Notification" in window && Notification.permission === "default") {
    Notification.requestPermission().catch(() => {});
  }
}

/** A system notification for a finished turn or a question (the agent's or the network's), while
 *  the tab is hidden. */
function notify(event, session) {
  if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
  const title = session?.title || "Warren";
  if (event.type === "turn_end") {
    new Notification(title, { body: event.stop_reason === "cancelled" ? "The turn was cancelled." : "The agent finished.", tag: `warren-${session.id}` });
  } else if (event.type === "permission_request") {
    new Notification(title, { body: `The agent asks to run: ${event.tool_call?.title ?? "a tool"}`, tag: `warren-${session.id}-perm` });
  } else if (event.type === "egress_request") {
    new Notification(title, { body: `The sandbox wants to reach ${hostPort(event.host, event.port)}`, tag: `warren-${session.id}-egress` });
  }
}
