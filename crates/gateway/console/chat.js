// The Chat view: the conversation log rebuilt from the session's event stream, the message box,
// the Cancel button and the answers to the agent's permission requests and the sandbox's network
// requests (one route for both). Events are folded into the conversation (conversation.js) as
// they come; the items they changed are re-rendered (render.js) once per animation frame, so a
// history of thousands of events costs one layout, not thousands. The message box's draft is
// kept in localStorage per session: a reconnect, a reload or a failed send never loses it.
// An error shown under the box goes when it is no longer true: a send or cancel that got no
// answer once the connection is back (and a message that did arrive after all leaves the box
// too), "still working" and a failed cancel once the turn ends.
//
// A command of the agent's that waits for input (prompt.js: still running, an unfinished last
// line and nothing new for a second, or a `read -p` prompt) shows its question above the
// message box with an answer box; the answer goes to the command's stdin (command-input.js)
// and the question goes once the command prints more or ends. A message typed in the message
// box while a command runs cannot go to the agent (its turn is not over): it is not sent, and
// the view offers "Send to the command" instead, one tap, so that nothing typed there reaches a
// command without the person saying so. `reveal(requestId)` scrolls to a permission or network
// request and marks it (a notification's link).
//
// A turn's "N files changed" opens that checkpoint's changes (`onCheckpoint`), a fork's first
// line links to its source session (`onOpenSession`). Coming back to the view (from those
// changes, say) shows the log where it was left, or its end when it was at its end.

import { EventStream, withQuery } from "./api.js";
import { applyEvent, createConversation } from "./conversation.js";
import { QUIET_MS, isSecretPrompt, promptOf, runningCommand } from "./prompt.js";
import { askNotificationPermission as askPermission, notifyInTab } from "./push.js";
import { renderItem } from "./render.js";
import { toDom } from "./vdom.js";

const draftKey = (sessionId) => `warren.draft.${sessionId}`;

export class ChatView {
  /**
   * `elements`: log, form, message, cancel, error, prompt (the question's form), promptText,
   * promptAnswer, promptError, offer (the "Send to the command" box), offerText, offerSend;
   * `api`; `onEvent(event, live)` for the other views; `onStatus(status)` for the connection;
   * `onWatch(terminalName)` for a tool's terminal; `onCheckpoint(checkpointId)` for a
   * checkpoint's changes; `onOpenSession(sessionId)` for a fork's source; `sessionTitle(id)`, a
   * session's title (null when unknown).
   */
  constructor({ elements, api, onEvent, onStatus, onWatch, onCheckpoint = () => {}, onOpenSession = () => {}, sessionTitle = () => null }) {
    this.el = elements;
    this.api = api;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.renderContext = { sessionTitle };
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
    this.command = null; // the agent's command running in a terminal now (prompt.js)
    this.commandSeen = { key: null, at: 0 }; // that command's output as last seen, and since when
    this.commandSince = { toolCallId: null, at: 0 }; // that command, and since when it is seen running
    this.answeredKey = null; // the output a question was answered at: not asked again until it changes
    this.answeredTools = new Set(); // commands answered once: their `read -p` was that answer's
    this.promptTimer = null;
    this.revealing = null; // { requestId, until }: a request to scroll to once it is shown
    this.revealedId = null; // the request marked as the one a link pointed at
    this.scrolled = null; // { top, atBottom } of the log as last seen on screen

    // The question's form and the offer (a view made without them answers no command).
    this.asks = Boolean(elements.prompt && elements.offer);
    this.el.prompt?.addEventListener("submit", (event) => {
      event.preventDefault();
      this.answerPrompt();
    });
    this.el.offerSend?.addEventListener("click", () => this.sendToCommand());

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
      const checkpoint = event.target.closest("button[data-checkpoint]");
      if (checkpoint) onCheckpoint(checkpoint.dataset.checkpoint);
      const source = event.target.closest("a[data-session]");
      if (source) {
        event.preventDefault();
        onOpenSession(source.dataset.session);
      }
    });
    this.el.log.addEventListener("scroll", () => {
      const log = this.el.log;
      if (log.clientHeight > 0) this.scrolled = { top: log.scrollTop, atBottom: log.scrollHeight - log.scrollTop - log.clientHeight < 80 };
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
    this.command = null;
    this.commandSeen = { key: null, at: 0 };
    this.commandSince = { toolCallId: null, at: 0 };
    this.answeredKey = null;
    this.answeredTools = new Set();
    this.revealing = null;
    this.revealedId = null;
    this.scrolled = null;
    if (this.asks) this.el.promptAnswer.value = "";
    this.showPrompt(null);
    this.showOffer(false);
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

  /** The Chat view opened: the log was hidden, so it could not follow the newest events; one
   *  left scrolled back is shown there again. */
  show() {
    const log = this.el.log;
    log.scrollTop = this.scrolled && !this.scrolled.atBottom ? this.scrolled.top : log.scrollHeight;
  }

  hide() {}

  /** Stops following the session's events for now (it is being deleted); `resume` goes on
   *  after the last one seen. */
  pause() {
    this.stream?.stop();
  }

  resume() {
    if (this.session) this.stream?.start(this.stream.lastSeq);
  }

  close() {
    this.stream?.stop();
    this.stream = null;
    this.session = null;
    clearTimeout(this.promptTimer);
    this.promptTimer = null;
  }

  /** Scrolls to the permission or network request `requestId` once it is shown, and marks it. */
  reveal(requestId) {
    this.revealing = { requestId, until: Date.now() + 20000 };
    this.scheduleFlush();
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
      const node = toDom(renderItem(item, this.renderContext), document);
      const old = this.nodes.get(item.id);
      if (item.requestId !== undefined && item.requestId === this.revealedId) node.classList.add("revealed");
      if (old) {
        // A thought the person unfolded stays unfolded while it streams.
        if (old.tagName === "DETAILS" && old.open) node.open = true;
        old.replaceWith(node);
      } else if (this.nodes.has(item.before)) {
        // Placed among earlier items (a checkpoint that came after the next turn began).
        this.nodes.get(item.before).before(node);
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
    if (this.revealing && this.historyShown) this.revealRequest();
    this.checkCommand();
  }

  /** The request `reveal` asked for, scrolled to and marked when it is in the log; given up on
   *  after a while (it was in another session, or compacted away). */
  revealRequest() {
    const { requestId, until } = this.revealing;
    const node = [...this.el.log.querySelectorAll(".permission[data-request-id]")].find((n) => n.dataset.requestId === requestId);
    if (!node) {
      if (Date.now() > until) this.revealing = null;
      return;
    }
    this.revealing = null;
    this.revealedId = requestId;
    for (const other of this.el.log.querySelectorAll(".revealed")) other.classList.remove("revealed");
    node.classList.add("revealed");
    node.scrollIntoView({ block: "center" });
  }

  // ---- a command that waits for input ----

  /** Follows the running command's output: its question shows once it has been quiet for
   *  QUIET_MS (a timer looks again then), and goes when it prints more or ends. */
  checkCommand() {
    clearTimeout(this.promptTimer);
    this.promptTimer = null;
    const command = runningCommand(this.conversation);
    this.command = command;
    const key = command ? `${command.toolCallId}\u0000${command.output}` : null;
    const now = Date.now();
    if (key !== this.commandSeen.key) this.commandSeen = { key, at: now };
    if ((command?.toolCallId ?? null) !== this.commandSince.toolCallId) this.commandSince = { toolCallId: command?.toolCallId ?? null, at: now };
    if (!command) {
      this.showPrompt(null);
      if (this.asks && !this.el.offer.hidden) {
        // The offer is moot: what the box holds can go to the agent now.
        this.showOffer(false);
        if (this.el.message.value.trim() !== "") this.showError("The command has ended: Send sends your message to the agent.");
      }
      return;
    }
    const commandLine = this.answeredTools.has(command.toolCallId) ? "" : command.title;
    const question = key === this.answeredKey ? null : promptOf(command.output, commandLine);
    const quietFor = now - this.commandSeen.at;
    if (question && quietFor >= QUIET_MS) {
      this.showPrompt(question);
    } else {
      this.showPrompt(null);
      if (question) this.promptTimer = setTimeout(() => this.checkCommand(), QUIET_MS - quietFor);
    }
    if (this.asks && !this.el.offer.hidden) this.showOffer(true);
  }

  /** Shows the command's `question` with the answer box (null hides them; what was typed in the
   *  box stays for when it shows again). */
  showPrompt(question) {
    if (!this.asks) return;
    const log = this.el.log;
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
    if (question === null) {
      this.el.prompt.hidden = true;
      this.el.promptError.hidden = true;
    } else if (this.el.prompt.hidden || this.el.promptText.textContent !== question) {
      this.el.promptText.textContent = question;
      this.el.promptAnswer.type = isSecretPrompt(question) ? "password" : "text";
      this.el.promptError.hidden = true;
      this.el.prompt.hidden = false;
    }
    // The box takes room from the log: its newest lines stay in view.
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  /** The offer to send the message box's text to the running command instead (`on`), or none. */
  showOffer(on) {
    if (!this.asks) return;
    if (!on || !this.command) {
      this.el.offer.hidden = true;
      return;
    }
    const question = this.el.prompt.hidden ? null : this.el.promptText.textContent;
    const title = this.command.title.length > 60 ? `${this.command.title.slice(0, 59)}…` : this.command.title;
    this.el.offerText.textContent = question
      ? `Not sent: the agent is busy with a command, which asks “${question}”.`
      : `Not sent: the agent is busy running “${title}” and takes messages when it ends.`;
    this.el.offer.hidden = false;
  }

  /** The answer box's text, and Enter, to the command. */
  async answerPrompt() {
    const button = this.el.prompt.querySelector('button[type="submit"]');
    button.disabled = true;
    try {
      if (await this.writeToCommand(this.el.promptAnswer.value, (error) => this.showPromptError(error))) this.el.promptAnswer.value = "";
    } finally {
      button.disabled = false;
    }
  }

  showPromptError(error) {
    this.el.promptError.textContent = `Not sent: ${error.message}`;
    this.el.promptError.hidden = false;
  }

  /** The message box's text, and Enter, to the command ("Send to the command"). */
  async sendToCommand() {
    const sessionId = this.session?.id;
    const text = this.el.message.value;
    this.el.offerSend.disabled = true;
    try {
      if (!(await this.writeToCommand(text, (error) => this.showError(`Not sent to the command: ${error.message}`)))) return;
    } finally {
      this.el.offerSend.disabled = false;
    }
    this.showOffer(false);
    this.showError("");
    if (this.session?.id === sessionId && this.el.message.value === text) {
      this.el.message.value = "";
      localStorage.removeItem(draftKey(sessionId));
    }
  }

  /** Writes `text` and Enter to the running command; whether it went (`onError` says why not).
   *  The question it answered is not asked again until the output changes. */
  async writeToCommand(text, onError) {
    const command = this.command;
    if (!command || !this.session) {
      onError(new Error("the command has ended"));
      return false;
    }
    const key = this.commandSeen.key;
    try {
      // Loaded with the first answer: most sessions never need it.
      const { commandUrl, sendLine } = await import("./command-input.js");
      await sendLine(commandUrl(location.origin, this.session.id, command.terminalId, this.api.token), text);
    } catch (error) {
      onError(error);
      return false;
    }
    this.answeredKey = key;
    this.answeredTools.add(command.toolCallId);
    this.checkCommand();
    return true;
  }

  updateControls() {
    this.el.cancel.disabled = !this.conversation.running;
  }

  async send() {
    if (!this.session) return;
    const text = this.el.message.value;
    if (text.trim() === "") return;
    askNotificationPermission();
    // The agent takes no message while its turn runs a command; the command may take it. (A
    // command that started a moment ago may be over at the gateway already: that one is asked.)
    if (this.asks && this.command && Date.now() - this.commandSince.at >= QUIET_MS) {
      this.showOffer(true);
      return;
    }
    const sessionId = this.session.id;
    const afterSeq = this.conversation.lastSeq;
    this.unsent = null;
    try {
      await this.api.request("POST", `/v1/sessions/${sessionId}/messages`, { json: { text } });
    } catch (error) {
      if (this.session?.id !== sessionId) return;
      if (error.code === "TURN_IN_PROGRESS") {
        // The agent takes no message while its turn runs a command; the command may take it.
        if (this.asks && this.command) return this.showOffer(true);
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

/** Asks for the permission to notify as the person first sends a message (push.js). */
function askNotificationPermission() {
  askPermission();
}

/** A live event of the open session, for its notification (a finished turn, a question of the
 *  agent's or the network's, lost hands) while the tab is hidden and this browser gets no
 *  pushes, and to close the notification of a question answered meanwhile (push.js; shown by
 *  the service worker, never `new Notification()`). */
function notify(event, session) {
  notifyInTab(event, session);
}
