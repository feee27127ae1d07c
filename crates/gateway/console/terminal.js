// The Terminal view: xterm.js on a terminal of the session's hands (`default`, the person's
// shell, or one of the agent's commands, watched read-only), over the PTY WebSocket protocol.
// - Attached only while the view is open (`show`/`hide`); an attached terminal keeps the hands
//   awake, so a hidden view must not hold one.
// - A drop reconnects with `since=<offset>` (OutputCursor), so nothing is shown twice and no
//   byte is lost; a holder that dropped comes back with `takeover=1`, evicting its own stale
//   connection, but one that was taken over (close 4001) stays a viewer until "Take over".
// - A holder attach that is refused (another client holds the shell) tries once more, then
//   watches as a viewer and says "read-only".
// - Replayed output is drawn but its queries are not answered (ReplayAnswerFilter): xterm's
//   answers would land in the shell as typed text.
// xterm.js (345 KB) is loaded on first use, not with the page.

import { CHANNEL, OutputCursor, ReplayAnswerFilter, terminalUrl, stdinFrame, keyBytes, withCtrl } from "./terminal-protocol.js";
import { installXtermCspShim, pruneDetachedStyles } from "./xterm-csp.js";

const RETRY_MS = [300, 1000, 2000, 5000];
const PING_EVERY_MS = 20000;
const PONG_WITHIN_MS = 10000;

let xtermLoaded = null;
function loadXterm() {
  if (!xtermLoaded) {
    installXtermCspShim();
    const link = document.createElement("link");
    link.rel = "stylesheet";
    link.href = "/console/vendor/xterm/xterm.css";
    document.head.append(link);
    xtermLoaded = Promise.all([import("./vendor/xterm/xterm.mjs"), import("./vendor/addon-fit/addon-fit.mjs")]).then(([xterm, fit]) => ({
      Terminal: xterm.Terminal,
      FitAddon: fit.FitAddon,
    }));
  }
  return xtermLoaded;
}

const THEMES = {
  light: { background: "#ffffff", foreground: "#1f2328", cursor: "#1f2328", cursorAccent: "#ffffff", selectionBackground: "#b6d6fd" },
  dark: { background: "#0d1117", foreground: "#e6edf3", cursor: "#e6edf3", cursorAccent: "#0d1117", selectionBackground: "#264f78" },
};
const darkScheme = window.matchMedia("(prefers-color-scheme: dark)");

export class TerminalView {
  /** `elements`: region, status, takeover, mine, keybar, agents (list), refresh; `api` (with its `token`). */
  constructor({ elements, api }) {
    this.el = elements;
    this.api = api;
    this.sessionId = null;
    this.name = "default";
    this.term = null;
    this.fit = null;
    this.answers = null;
    this.cursor = new OutputCursor();
    this.socket = null;
    this.role = null;
    this.visible = false;
    this.retryTimer = null;
    this.failures = 0;
    this.holderRetries = 0;
    this.exitCode = null;
    this.ctrlArmed = false;
    this.pipeMode = false;
    this.pingTimer = null;
    this.lastPingAt = 0;
    this.lastPongAt = 0;
    this.showTicket = 0;

    this.el.takeover.addEventListener("click", () => this.takeOver());
    this.el.mine.addEventListener("click", () => this.watch("default"));
    this.el.refresh.addEventListener("click", () => this.listAgentTerminals());
    this.el.agents.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-terminal]");
      if (button) this.watch(button.dataset.terminal);
    });
    // Key bar buttons must not take the focus from the terminal (the phone keyboard would close).
    this.el.keybar.addEventListener("pointerdown", (event) => {
      if (event.target.closest("button")) event.preventDefault();
    });
    this.el.keybar.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-key]");
      if (button) this.pressKey(button.dataset.key);
    });
    window.addEventListener("offline", () => this.connectionLost());
    window.addEventListener("online", () => this.retryNow());
    window.addEventListener("pagehide", () => this.detach());
    darkScheme.addEventListener("change", () => {
      if (this.term) this.term.options.theme = darkScheme.matches ? THEMES.dark : THEMES.light;
    });
    new ResizeObserver(() => this.refit()).observe(this.el.region);
  }

  /** Chooses the session; the terminal attaches when the view is shown. */
  setSession(sessionId) {
    if (sessionId === this.sessionId) return;
    this.hide();
    this.disposeTerminal();
    this.sessionId = sessionId;
    this.name = "default";
  }

  /** The view opened: attach (creating the xterm on first use). */
  async show() {
    if (this.visible && this.socket) return;
    this.visible = true;
    // Not the last attach's words: nothing typed goes anywhere until this one is connected.
    this.status("attaching…");
    const ticket = ++this.showTicket;
    const [{ Terminal, FitAddon }, terminals] = await Promise.all([loadXterm(), this.fetchTerminals()]);
    // Only the latest `show` attaches (the view may have been closed or reopened meanwhile).
    if (ticket !== this.showTicket || !this.visible || !this.sessionId) return;
    if (!this.term) {
      this.term = new Terminal({
        cursorBlink: false,
        fontFamily: 'ui-monospace, "SF Mono", Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", monospace',
        fontSize: window.innerWidth < 500 ? 13 : 14,
        scrollback: 5000,
        theme: darkScheme.matches ? THEMES.dark : THEMES.light,
      });
      this.fit = new FitAddon();
      this.term.loadAddon(this.fit);
      this.term.open(this.el.region);
      this.answers = new ReplayAnswerFilter((data) => this.type(data));
      this.term.onData((data) => this.answers.data(data));
      this.term.onResize(() => this.sendResize());
      this.cursor = new OutputCursor();
    }
    if (terminals) {
      const shell = terminals.find((t) => t.name === this.name);
      // Rebuilt hands give the name a new shell whose output starts again at 0.
      if (shell && shell.output_offset < this.cursor.offset) {
        this.term.reset();
        this.cursor = new OutputCursor();
      }
      this.renderAgentTerminals(terminals);
    }
    this.refit();
    this.updateControls();
    this.holderRetries = 0;
    this.connect(this.preferredMode());
    if (!matchMedia("(pointer: coarse)").matches) this.term.focus();
  }

  /** The view closed: detach, keeping the screen and its offset for the next `show`. */
  hide() {
    this.visible = false;
    this.showTicket++;
    this.detach();
  }

  /** Watches terminal `name` of this session (`default` is the person's shell). */
  watch(name) {
    this.detach();
    this.disposeTerminal();
    this.name = name;
    if (this.visible) this.show();
  }

  takeOver() {
    this.detach();
    this.status("taking over…");
    this.connect("takeover");
  }

  preferredMode() {
    return this.name === "default" ? "holder" : "viewer";
  }

  connect(mode) {
    if (!this.visible || !this.term) return;
    this.clearRetry();
    this.exitCode = null;
    if (this.socket) {
      const old = this.socket;
      this.socket = null;
      old.close(1000, "replaced");
    }
    const url = terminalUrl(location.origin, this.sessionId, this.name, {
      token: this.api.token,
      since: this.cursor.offset,
      viewer: mode === "viewer",
      takeover: mode === "takeover",
    });
    const socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    const attempt = { mode, connected: false };
    this.socket = socket;
    socket.onmessage = (message) => {
      if (socket !== this.socket) return;
      if (typeof message.data === "string") this.control(message.data, attempt);
      else this.output(new Uint8Array(message.data));
    };
    socket.onclose = (event) => {
      if (socket !== this.socket) return;
      this.socket = null;
      this.stopPing();
      this.closed(event.code, attempt);
    };
  }

  output(frame) {
    const { bytes, missed } = this.cursor.accept(frame);
    if (missed > 0) this.term.write(`\r\n\x1b[2m[${missed} bytes of output are no longer kept]\x1b[0m\r\n`);
    // Viewers get every chunk as a replay; they send nothing anyway.
    if (bytes.length > 0) this.term.write(bytes, this.answers.parsed(frame[0] === CHANNEL.replay));
  }

  control(text, attempt) {
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    switch (message.type) {
      case "connected":
        attempt.connected = true;
        this.role = message.role;
        this.pipeMode = message.mode === "pipe";
        this.failures = 0;
        this.holderRetries = 0;
        if (this.role === "holder") {
          this.status(this.name === "default" ? "your shell: typing goes to it" : "you hold the agent's command: typing goes to it");
          this.sendResize();
        } else {
          this.status(this.name === "default" ? "read-only: another client holds this terminal" : "read-only: watching the agent's command");
        }
        this.startPing();
        break;
      case "exit":
        this.exitCode = message.exit_code;
        break;
      case "pong":
        this.lastPongAt = Date.now();
        break;
      case "error":
        if (message.code === "READ_ONLY") this.status("read-only: press Take over to type");
        else this.status(`terminal error: ${message.error ?? message.code}`);
        break;
      default:
        break;
    }
    this.updateControls();
  }

  closed(code, attempt) {
    this.role = null;
    this.updateControls();
    if (!this.visible) return;
    if (code === 4001) {
      this.status("read-only: another client took over");
      this.connect("viewer");
      return;
    }
    if (this.exitCode !== null) {
      if (this.name === "default") {
        this.status(`the shell exited (${this.exitCode}); starting a new one`);
        this.scheduleRetry("holder", 1000);
      } else {
        this.status(`the command ended (exit ${this.exitCode})`);
      }
      return;
    }
    if (!attempt.connected && attempt.mode !== "viewer") {
      // Refused, most likely because another client holds the shell (a reloaded page's old
      // connection may still be closing): try once more, then watch.
      if (this.holderRetries++ < 1) this.scheduleRetry(attempt.mode, 600);
      else this.connect("viewer");
      return;
    }
    if (!attempt.connected && this.name !== "default" && this.failures >= 2) {
      this.status("the command is not running");
      return;
    }
    const next = attempt.connected && attempt.mode !== "viewer" ? "takeover" : attempt.connected ? "viewer" : this.preferredMode();
    this.status("the terminal dropped: attaching again…");
    this.scheduleRetry(next, RETRY_MS[Math.min(this.failures++, RETRY_MS.length - 1)]);
  }

  scheduleRetry(mode, delayMs) {
    this.clearRetry();
    this.retryMode = mode;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.connect(mode);
    }, delayMs);
  }

  clearRetry() {
    if (this.retryTimer !== null) clearTimeout(this.retryTimer);
    this.retryTimer = null;
  }

  retryNow() {
    if (this.retryTimer !== null) {
      const mode = this.retryMode;
      this.clearRetry();
      this.connect(mode);
    }
  }

  /** The network is gone (the browser says so, or pings go unanswered): treat it as a drop now. */
  connectionLost() {
    const socket = this.socket;
    if (!socket) return;
    this.socket = null;
    this.stopPing();
    socket.close();
    this.closed(1006, { mode: this.role === "holder" ? "holder" : "viewer", connected: true });
  }

  detach() {
    this.clearRetry();
    this.stopPing();
    const socket = this.socket;
    this.socket = null;
    this.role = null;
    if (socket) socket.close(1000, "view closed");
    this.updateControls();
  }

  disposeTerminal() {
    if (this.term) this.term.dispose();
    this.term = null;
    this.fit = null;
    this.answers = null;
    this.cursor = new OutputCursor();
    pruneDetachedStyles();
  }

  startPing() {
    this.stopPing();
    this.lastPongAt = Date.now();
    this.pingTimer = setInterval(() => {
      if (!this.socket || this.socket.readyState !== WebSocket.OPEN) return;
      if (this.lastPingAt > this.lastPongAt && Date.now() - this.lastPingAt > PONG_WITHIN_MS) {
        this.connectionLost();
        return;
      }
      this.lastPingAt = Date.now();
      this.socket.send(JSON.stringify({ type: "ping" }));
    }, PING_EVERY_MS);
  }

  stopPing() {
    if (this.pingTimer !== null) clearInterval(this.pingTimer);
    this.pingTimer = null;
  }

  type(data) {
    if (this.ctrlArmed) {
      data = withCtrl(data);
      this.setCtrl(false);
    }
    this.send(data);
  }

  send(data) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN && this.role === "holder") {
      // A command on pipes has no line discipline to turn the Enter key's \r into a newline.
      this.socket.send(stdinFrame(this.pipeMode ? data.replace(/\r/g, "\n") : data));
    } else if (this.role === "viewer") {
      this.status("read-only: press Take over to type");
    }
  }

  pressKey(key) {
    if (key === "Ctrl") this.setCtrl(!this.ctrlArmed);
    else this.send(keyBytes(key, this.term?.modes.applicationCursorKeysMode ?? false));
    this.term?.focus();
  }

  setCtrl(armed) {
    this.ctrlArmed = armed;
    this.el.keybar.querySelector('[data-key="Ctrl"]')?.setAttribute("aria-pressed", String(armed));
  }

  refit() {
    if (!this.term || !this.fit || this.el.region.clientWidth === 0) return;
    try {
      this.fit.fit();
    } catch {
      // The fit addon measures the rendered font; before the first paint there is nothing to fit.
    }
  }

  sendResize() {
    if (!this.term || !this.socket || this.socket.readyState !== WebSocket.OPEN || this.role !== "holder") return;
    this.socket.send(JSON.stringify({ type: "resize", cols: this.term.cols, rows: this.term.rows }));
  }

  status(text) {
    this.el.status.textContent = text;
  }

  updateControls() {
    this.el.takeover.hidden = this.role === "holder";
    this.el.mine.hidden = this.name === "default";
  }

  async fetchTerminals() {
    try {
      return await this.api.request("GET", `/v1/sessions/${this.sessionId}/terminals`);
    } catch {
      return null;
    }
  }

  async listAgentTerminals() {
    const terminals = await this.fetchTerminals();
    if (terminals) this.renderAgentTerminals(terminals);
  }

  renderAgentTerminals(terminals) {
    const list = this.el.agents;
    const agents = terminals.filter((t) => t.kind === "agent");
    list.replaceChildren(
      ...agents.map((t) => {
        const item = document.createElement("li");
        const title = document.createElement("code");
        title.textContent = t.title || t.name;
        const state = document.createElement("span");
        state.className = "meta";
        state.textContent = t.running ? " running " : " ended ";
        const button = document.createElement("button");
        button.type = "button";
        button.dataset.terminal = t.name;
        button.textContent = "Watch";
        button.setAttribute("aria-label", `Watch ${t.title || t.name}`);
        item.append(title, state, button);
        return item;
      }),
    );
    if (agents.length === 0) {
      const item = document.createElement("li");
      item.className = "meta";
      item.textContent = "The agent runs no command now.";
      list.append(item);
    }
  }
}
