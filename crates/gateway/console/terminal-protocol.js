// The PTY WebSocket protocol (spec/pty-sessions.md) as pure functions: the attach URL, stdin
// frames, the key bar's bytes, and `OutputCursor`, which tracks the byte offset of what the
// screen has shown so that a reconnect with `since=<offset>` (or an overlapping replay) writes
// every byte exactly once, and `ReplayAnswerFilter`, which keeps xterm's answers to replayed
// queries off the PTY. No WebSocket and no xterm here; terminal.js wires them.

export const CHANNEL = { stdin: 0x00, stdout: 0x01, stderr: 0x02, replay: 0x03 };

/** The WebSocket URL of terminal `name` of session `sessionId`, on the page's origin `origin`. */
export function terminalUrl(origin, sessionId, name, { token, since = 0, viewer = false, takeover = false }) {
  const base = origin.replace(/^http/, "ws");
  const query = new URLSearchParams({ access_token: token, since: String(since) });
  if (viewer) query.set("mode", "viewer");
  else if (takeover) query.set("takeover", "1");
  return `${base}/v1/sessions/${encodeURIComponent(sessionId)}/terminals/${encodeURIComponent(name)}/ws?${query}`;
}

const encoder = new TextEncoder();

/** A binary stdin frame (channel 0x00) carrying `text` as UTF-8. */
export function stdinFrame(text) {
  const bytes = encoder.encode(text);
  const frame = new Uint8Array(bytes.length + 1);
  frame[0] = CHANNEL.stdin;
  frame.set(bytes, 1);
  return frame;
}

/**
 * The position in a terminal's output: `accept(frame)` takes one binary frame from the server
 * and returns `{bytes, missed}`: the bytes not shown yet (live frames continue at the offset;
 * a replay frame carries its own 8-byte offset and may overlap what was shown) and how many
 * bytes the server no longer had (a replay that starts past the offset: the ring moved on).
 */
export class OutputCursor {
  constructor(offset = 0) {
    this.offset = offset;
  }

  accept(frame) {
    const channel = frame[0];
    if (channel === CHANNEL.stdout || channel === CHANNEL.stderr) {
      const bytes = frame.subarray(1);
      this.offset += bytes.length;
      return { bytes, missed: 0 };
    }
    if (channel === CHANNEL.replay && frame.length >= 9) {
      const view = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
      const start = Number(view.getBigUint64(1));
      const bytes = frame.subarray(9);
      const end = start + bytes.length;
      if (end <= this.offset) return { bytes: bytes.subarray(0, 0), missed: 0 };
      const missed = Math.max(0, start - this.offset);
      const fresh = bytes.subarray(Math.max(0, this.offset - start));
      this.offset = end;
      return { bytes: fresh, missed };
    }
    return { bytes: frame.subarray(0, 0), missed: 0 };
  }
}

/**
 * Keeps xterm's answers to replayed output from reaching the PTY. xterm.js answers the queries
 * in what it parses (device attributes `ESC[c`, cursor position `ESC[6n`, colours `OSC 10;?`…)
 * through `onData`, the same event as the keys typed. A replay is old output: its queries were
 * answered (or not) when they were live, and answering them again types the answers into
 * whatever runs now (the shell prompt, an open editor). A query that arrives live is answered,
 * since a running program waits for it.
 *
 * Every `term.write(bytes, filter.parsed(replay))` says whether its bytes are a replay;
 * `term.onData((data) => filter.data(data))`. xterm parses a write synchronously and calls its
 * callback right after, in the same task, so what `onData` emits in that task before the callback
 * is that write's answers: dropped for a replay, sent for live output. What is emitted in any
 * other task (a key, a paste, a mouse report) is sent at the end of its task, in order. With no
 * write waiting to be parsed, `onData` goes straight to `send`.
 */
export class ReplayAnswerFilter {
  constructor(send) {
    this.send = send;
    this.unparsed = 0;
    this.held = []; // {data, task, verdict: null | "send" | "drop"}, in the order emitted
    this.task = 0; // which task (macrotask) `onData` ran in; counted up at each one's end
    this.taskEndQueued = false;
  }

  /** The callback for `term.write(bytes, callback)`: `replay` for replayed bytes. */
  parsed(replay) {
    this.unparsed++;
    return () => {
      this.unparsed--;
      this.settle(this.currentTask(), replay ? "drop" : "send");
    };
  }

  /** What xterm emitted through `onData`. */
  data(data) {
    if (this.unparsed === 0 && this.held.length === 0) {
      this.send(data);
      return;
    }
    this.held.push({ data, task: this.currentTask(), verdict: null });
  }

  /** This task's number; at its end (the first microtask checkpoint) what it emitted is sent. */
  currentTask() {
    if (!this.taskEndQueued) {
      this.taskEndQueued = true;
      queueMicrotask(() => {
        const ended = this.task++;
        this.taskEndQueued = false;
        this.settle(ended, "send");
      });
    }
    return this.task;
  }

  settle(task, verdict) {
    for (const item of this.held) if (item.task === task && item.verdict === null) item.verdict = verdict;
    while (this.held.length > 0 && this.held[0].verdict !== null) {
      const item = this.held.shift();
      if (item.verdict === "send") this.send(item.data);
    }
  }
}

/** What a key of the touch key bar sends; arrows follow the terminal's cursor-key mode. */
export function keyBytes(key, applicationCursor = false) {
  const arrow = { Up: "A", Down: "B", Right: "C", Left: "D" }[key];
  if (arrow) return (applicationCursor ? "\x1bO" : "\x1b[") + arrow;
  return { Esc: "\x1b", Tab: "\t", "Ctrl-C": "\x03" }[key] ?? "";
}

/** The control character for `Ctrl` + one typed character, or the text unchanged. */
export function withCtrl(text) {
  if (text.length !== 1) return text;
  const code = text.toUpperCase().charCodeAt(0);
  if (code >= 0x40 && code <= 0x5f) return String.fromCharCode(code & 0x1f); // @ A–Z [ \ ] ^ _
  if (text === " ") return "\x00";
  if (text === "?") return "\x7f";
  return text;
}
