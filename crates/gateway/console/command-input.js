// Typing a line into one of the agent's commands, for the answer box of a command that waits
// for input (chat.js). The public API's way in is the terminal's WebSocket
// (files-terminals-previews.md: an agent's terminal is answered with `takeover=1`; the agent
// keeps driving it and is never evicted): `sendLine` attaches as the holder with no replay
// (`since` past the end), writes the line and Enter (`\n` on pipes, where no line discipline
// turns `\r` into one; `\r` on a PTY), asks for a `pong` to know the gateway has passed the
// bytes on (frames are handled in order), and lets go. A person who held the command in
// another window is taken over (4001) as with the Terminal view's "Take over".

import { stdinFrame, terminalUrl } from "./terminal-protocol.js";

/** How long one answer may take (attach, write, pong). */
export const SEND_TIMEOUT_MS = 10000;

/** The WebSocket URL that answers the agent's terminal `terminalId` of a session. */
export function commandUrl(origin, sessionId, terminalId, token) {
  return terminalUrl(origin, sessionId, `term-${terminalId}`, { token, since: Number.MAX_SAFE_INTEGER, takeover: true });
}

/** The bytes a line becomes in a terminal of `mode` ("pipe" or "pty"). */
export function lineBytes(text, mode) {
  return stdinFrame(text + (mode === "pipe" ? "\n" : "\r"));
}

/** Writes `text` and Enter to the terminal at `url`; resolves once written, rejects with an
 *  Error saying why not. */
export function sendLine(url, text, { WebSocketImpl = globalThis.WebSocket, timeoutMs = SEND_TIMEOUT_MS } = {}) {
  return new Promise((resolve, reject) => {
    const socket = new WebSocketImpl(url);
    socket.binaryType = "arraybuffer";
    let written = false;
    let done = false;
    const finish = (error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      try {
        socket.close(1000, "answered");
      } catch {
        // Closed already.
      }
      if (error) reject(error);
      else resolve();
    };
    const timer = setTimeout(() => finish(new Error("the command did not answer in time")), timeoutMs);
    socket.onmessage = (message) => {
      if (typeof message.data !== "string") return; // output: the conversation shows it
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      if (frame.type === "connected") {
        if (frame.role !== "holder") return finish(new Error("the command could not be taken over"));
        written = true;
        socket.send(lineBytes(text, frame.mode));
        socket.send(JSON.stringify({ type: "ping" }));
      } else if (frame.type === "pong" && written) {
        finish();
      } else if (frame.type === "exit") {
        finish(written ? null : new Error("the command has ended"));
      } else if (frame.type === "error") {
        finish(new Error(frame.error ?? frame.code ?? "the terminal refused the answer"));
      }
    };
    socket.onclose = () => {
      // Sent before the close: the gateway had the bytes.
      finish(written ? null : new Error("the command is not running any more"));
    };
  });
}
