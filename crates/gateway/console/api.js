// The gateway's HTTP API as the console uses it: `createApi` sends requests with the device
// token and turns `{"code","message"}` answers into `ApiError`s, and `EventStream` follows a
// session's event stream (one `EventSource`) across network drops. On an error it closes the
// source and opens a new one with `?after=<last seq>`, and it drops any event whose seq is not
// above the last one it delivered, so a resume has no gap and no duplicate. Nothing here touches
// the page.

/** An error answer (`status` 0 and code `NETWORK` when no answer came). */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code);
    this.status = status;
    this.code = code;
  }
}

/** Requests against `base` (the gateway's origin, "" for this one) with `token`. */
export function createApi({ base = "", token, fetchImpl = globalThis.fetch.bind(globalThis) }) {
  async function request(method, path, { json, body, headers = {} } = {}) {
    const init = { method, headers: { ...headers } };
    if (token) init.headers.Authorization = `Bearer ${token}`;
    if (json !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(json);
    } else if (body !== undefined) {
      init.body = body;
    }
    let response;
    try {
      response = await fetchImpl(base + path, init);
    } catch (error) {
      throw new ApiError(0, "NETWORK", `the gateway did not answer (${error.message})`);
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = text;
      }
    }
    if (!response.ok) {
      throw new ApiError(response.status, data?.code ?? `HTTP_${response.status}`, data?.message ?? response.statusText);
    }
    return data;
  }
  return { base, token, request };
}

/** A path with its query: `withQuery("/x", {a: 1, b: undefined})` is `/x?a=1`. */
export function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== false) query.set(name, String(value));
  }
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/** Every event type of docs/gateway.md ("Events") and network.md; EventSource only reports named
 *  types it is told. */
export const EVENT_TYPES = [
  "user_message", "turn_start", "update", "permission_request", "permission_resolved",
  "turn_end", "usage", "status", "hands", "files_changed", "error", "gap",
  "egress_request", "egress", "credential_used",
];

const RETRY_MS = [250, 1000, 2000, 5000, 10000];

/**
 * Follows one session's events. `url(after)` gives the stream's address for a resume position;
 * `onEvent(event)` gets each new event once, in order; `onStatus("connected" | "reconnecting")`
 * says how the connection is.
 */
export class EventStream {
  constructor({ url, onEvent, onStatus = () => {}, EventSourceImpl = globalThis.EventSource, timers = globalThis }) {
    this.url = url;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.EventSourceImpl = EventSourceImpl;
    this.timers = timers;
    this.lastSeq = 0;
    this.source = null;
    this.retryTimer = null;
    this.failures = 0;
    this.stopped = true;
    this.status = null;
  }

  /** Opens the stream, delivering events after `after`. */
  start(after = 0) {
    this.lastSeq = after;
    this.stopped = false;
    this.open();
  }

  /** Closes the stream for good. */
  stop() {
    this.stopped = true;
    this.close();
    if (this.retryTimer !== null) this.timers.clearTimeout(this.retryTimer);
    this.retryTimer = null;
  }

  /** The network is known to be gone (the browser says it is offline). */
  drop() {
    if (!this.stopped) this.failed();
  }

  /** Reconnects at once (the network came back, the tab became visible). */
  reconnectNow() {
    if (this.stopped) return;
    if (this.source && this.source.readyState !== 2 && this.status === "connected") return;
    if (this.retryTimer !== null) this.timers.clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.close();
    this.open();
  }

  open() {
    const source = new this.EventSourceImpl(this.url(this.lastSeq));
    this.source = source;
    source.onopen = () => {
      if (source !== this.source) return;
      this.failures = 0;
      this.setStatus("connected");
    };
    const onMessage = (message) => {
      if (source !== this.source) return;
      this.deliver(message.data);
    };
    for (const type of EVENT_TYPES) {
      if (type !== "error") source.addEventListener(type, onMessage);
    }
    // An event named `error` arrives as a MessageEvent with data; a failed connection as a plain
    // Event without.
    source.addEventListener("error", (event) => {
      if (source !== this.source) return;
      if (typeof event.data === "string") this.deliver(event.data);
      else this.failed();
    });
  }

  deliver(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (typeof event.seq === "number") {
      if (event.seq <= this.lastSeq) return;
      this.lastSeq = event.seq;
    }
    this.onEvent(event);
  }

  failed() {
    this.close();
    this.setStatus("reconnecting");
    if (this.stopped || this.retryTimer !== null) return;
    const delay = RETRY_MS[Math.min(this.failures, RETRY_MS.length - 1)];
    this.failures++;
    this.retryTimer = this.timers.setTimeout(() => {
      this.retryTimer = null;
      if (!this.stopped) this.open();
    }, delay);
  }

  close() {
    if (this.source) this.source.close();
    this.source = null;
  }

  setStatus(status) {
    if (status === this.status) return;
    this.status = status;
    this.onStatus(status);
  }
}
