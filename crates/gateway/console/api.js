// The gateway's HTTP API as the console uses it: `createApi` sends requests with the device
// token and turns `{"code","message"}` answers into `ApiError`s, and `EventStream` follows a
// session's event stream (one `EventSource`) across network drops. On an error it closes the
// source and opens a new one with `?after=<last seq>`, and it drops any event whose seq is not
// above the last one it delivered, so a resume has no gap and no duplicate. A connection can
// also die without an error (a frozen TCP stream after the phone moved from Wi-Fi to mobile
// data): with `watch`, the stream (opened with `?heartbeat=event`) expects an event or a
// `heartbeat` at least every heartbeat interval, which the heartbeats themselves say, and after
// two intervals of silence it treats the connection as failed. Nothing here touches the page.

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

/** Every event type of docs/gateway.md ("Events"), network.md and checkpoints.md; EventSource
 *  only reports named types it is told. */
export const EVENT_TYPES = [
  "user_message", "turn_start", "update", "permission_request", "permission_resolved",
  "turn_end", "usage", "status", "hands", "files_changed", "error", "gap",
  "egress_request", "egress", "credential_used", "checkpoint", "forked", "rewound",
];

const RETRY_MS = [250, 1000, 2000, 5000, 10000];
/** The gateway's default `--sse-heartbeat-ms`, until a heartbeat says the real one. */
export const DEFAULT_HEARTBEAT_MS = 15000;
/** How many heartbeat intervals of silence make a connection dead. */
const SILENT_INTERVALS = 2;

/**
 * Follows one session's events. `url(after)` gives the stream's address for a resume position;
 * `onEvent(event)` gets each new event once, in order; `onStatus("connected" | "reconnecting")`
 * says how the connection is. With `watch`, a source that brings nothing (no event, no
 * `heartbeat`) for two heartbeat intervals, connecting or connected, is closed and replaced;
 * `url` should then ask for heartbeat events (`heartbeat=event`).
 */
export class EventStream {
  constructor({ url, onEvent, onStatus = () => {}, EventSourceImpl = globalThis.EventSource, timers = globalThis, now = () => Date.now(), watch = false }) {
    this.url = url;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.EventSourceImpl = EventSourceImpl;
    this.timers = timers;
    this.now = now;
    this.watch = watch;
    this.heartbeatMs = DEFAULT_HEARTBEAT_MS;
    this.lastHeard = 0; // when the current source last brought anything (or was opened)
    this.watchTimer = null;
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
    this.reopen();
  }

  /**
   * The page came back (the tab is visible again) or the network changed (`online`): whatever
   * the source seems to be, a connection made before may be dead without knowing it, so a fresh
   * one replaces it, resuming after the last seq. The status says "reconnecting" at once when
   * the current source is already overdue (silent for more than one heartbeat interval);
   * otherwise it stays until the new source opens or fails.
   */
  wake() {
    if (this.stopped) return;
    if (this.silentFor() > this.heartbeatMs) this.setStatus("reconnecting");
    this.reopen();
  }

  /** How long the current source has brought nothing. */
  silentFor() {
    return this.source ? this.now() - this.lastHeard : Infinity;
  }

  reopen() {
    if (this.retryTimer !== null) this.timers.clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.close();
    this.open();
  }

  open() {
    const source = new this.EventSourceImpl(this.url(this.lastSeq));
    this.source = source;
    this.heard();
    this.armWatch();
    source.onopen = () => {
      if (source !== this.source) return;
      this.failures = 0;
      this.heard();
      this.setStatus("connected");
    };
    const onMessage = (message) => {
      if (source !== this.source) return;
      this.heard();
      this.deliver(message.data);
    };
    for (const type of EVENT_TYPES) {
      if (type !== "error") source.addEventListener(type, onMessage);
    }
    // Not a session event: no seq, never delivered; it says the connection lives and how often
    // it will say so.
    source.addEventListener("heartbeat", (message) => {
      if (source !== this.source) return;
      this.heard();
      this.heartbeat(message.data);
    });
    // An event named `error` arrives as a MessageEvent with data; a failed connection as a plain
    // Event without.
    source.addEventListener("error", (event) => {
      if (source !== this.source) return;
      if (typeof event.data === "string") {
        this.heard();
        this.deliver(event.data);
      } else this.failed();
    });
  }

  heard() {
    this.lastHeard = this.now();
  }

  heartbeat(data) {
    let beat;
    try {
      beat = JSON.parse(data);
    } catch {
      return;
    }
    const interval = beat?.interval_ms;
    if (typeof interval === "number" && interval > 0 && interval !== this.heartbeatMs) {
      this.heartbeatMs = interval;
      // The deadline follows the interval the gateway uses (a shorter one is noticed sooner).
      this.disarmWatch();
      this.armWatch();
    }
  }

  /** The deadline of the current source: `SILENT_INTERVALS` heartbeat intervals after it was
   *  last heard from. One timer per source, moved on only when it fires (not at every event). */
  armWatch() {
    if (!this.watch || this.watchTimer !== null || !this.source) return;
    const wait = Math.max(0, SILENT_INTERVALS * this.heartbeatMs - this.silentFor());
    this.watchTimer = this.timers.setTimeout(() => {
      this.watchTimer = null;
      this.check();
    }, wait);
  }

  disarmWatch() {
    if (this.watchTimer !== null) this.timers.clearTimeout(this.watchTimer);
    this.watchTimer = null;
  }

  /** Fails the current source if it has been silent for too long; otherwise waits on. */
  check() {
    if (this.stopped || !this.source) return;
    if (this.silentFor() >= SILENT_INTERVALS * this.heartbeatMs) this.failed();
    else this.armWatch();
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
    this.disarmWatch();
    if (this.source) this.source.close();
    this.source = null;
  }

  setStatus(status) {
    if (status === this.status) return;
    this.status = status;
    this.onStatus(status);
  }
}
