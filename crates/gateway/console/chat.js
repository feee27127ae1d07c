// The Chat view: the conversation log rebuilt from the session's event stream, the message box,
// the Cancel button and the answers to the agent's permission requests and the sandbox's network
// requests (one route for both). Events are folded into the conversation (conversation.js) as
// they come; the items they changed are re-rendered (render.js) once per animation frame, so a
// history of thousands of events costs one layout, not thousands. The message box's draft is
// kept in localStorage per session: a reconnect, a reload or a failed send never loses it.
// An error shown under the box goes when it is no longer true: a send or cancel that got no
// answer once the connection is back (and a message that did arrive after all leaves the box
// too), "still working" and a failed cancel once the turn ends.

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
    this.errorEndsOn = []; // what makes the shown error untrue: "connected", "turn_end", "arrived"
    this.unsent = null; // { text, afterSeq } of a message whose POST got no answer

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
    // Back online or back in view: the connection may have died without a word (a network
    // switch, a sleeping phone), so the stream is opened afresh after its last seq.
    window.addEventListener("online", () => this.stream?.wake());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) {
        this.stream?.wake();
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
    this.unsent = null;
    this.updateControls();
    const token = this.api.token;
    this.stream = new EventStream({
      url: (after) => withQuery(`/v1/sessions/${encodeURIComponent(session.id)}/events`, { access_token: token, after, heartbeat: "event" }),
      onEvent: (event) => this.receive(event),
      onStatus: (status) => {
        // Back in touch: what failed for want of a network may work now; the box still holds
        // an unsent message.
        if (status === "connected") this.errorEnds("connected");
        this.onStatus(status);
      },
      watch: true,
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
    if (event.type === "user_message" && this.unsent && event.seq > this.unsent.afterSeq && event.text === this.unsent.text) {
      this.arrived(this.unsent.text);
    }
    if (event.type === "turn_end") this.errorEnds("turn_end");
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
    const afterSeq = this.conversation.lastSeq;
    this.unsent = null;
    try {
      await this.api.request("POST", `/v1/sessions/${sessionId}/messages`, { json: { text } });
    } catch (error) {
      if (this.session?.id !== sessionId) return;
      if (error.code === "TURN_IN_PROGRESS") {
        this.showError("The agent is still working: wait, or Cancel the turn.", ["turn_end"]);
        return;
      }
      if (error.status === 0) {
        // No answer: the message may still have reached the gateway (its user_message says so).
        if (this.delivered(text, afterSeq)) return this.arrived(text);
        this.unsent = { text, afterSeq };
        this.showError(`Not sent: ${error.message}`, ["connected", "arrived"]);
        return;
      }
      this.showError(`Not sent: ${error.message}`);
      return;
    }
    this.showError("");
    // Only clear what was sent: the person may have typed on while the request was out.
    if (this.session?.id === sessionId && this.el.message.value === text) {
      this.el.message.value = "";
      localStorage.removeItem(draftKey(sessionId));
    }
  }

  /** Whether a user message `text` came after seq `afterSeq`. */
  delivered(text, afterSeq) {
    return this.conversation.items.some((item) => item.kind === "user" && item.seq > afterSeq && item.text === text);
  }

  /** A message whose POST got no answer did reach the gateway: not an error after all, and the
   *  box no longer needs to keep it (unless the person changed it since). */
  arrived(text) {
    this.unsent = null;
    this.errorEnds("arrived");
    if (this.el.message.value === text) {
      this.el.message.value = "";
      if (this.session) localStorage.removeItem(draftKey(this.session.id));
    }
  }

  async cancel() {
    if (!this.session) return;
    try {
      await this.api.request("POST", `/v1/sessions/${this.session.id}/cancel`);
    } catch (error) {
      if (error.code !== "NO_TURN_RUNNING") this.showError(`Cancel failed: ${error.message}`, error.status === 0 ? ["connected", "turn_end"] : ["turn_end"]);
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
      this.showError(`Not answered: ${error.message}`, error.status === 0 ? ["connected"] : []);
    }
  }

  /** `what` happened ("connected", "turn_end", "arrived"): an error it makes untrue goes. */
  errorEnds(what) {
    if (this.errorEndsOn.includes(what)) this.showError("");
  }

  /** Shows `text` under the box ("" hides it) until one of `endsOn` happens (see errorEnds). */
  showError(text, endsOn = []) {
    this.errorEndsOn = text === "" ? [] : endsOn;
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
