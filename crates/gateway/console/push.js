// Notifications (phone.md "Push"), the page's side: the "Notifications" switch of the Account
// panel, which subscribes this browser to the gateway's pushes (`GET /v1/push/key`,
// `pushManager.subscribe`, `POST /v1/push/subscriptions`) and unsubscribes it, and says truthfully
// where it stands (on, off, refused by the browser, not available here); the device token kept
// in IndexedDB for the service worker, which answers a request from its notification without
// the page; and, for a page with no push subscription, its own notifications of what its event
// stream brings while it is hidden, handed to the service worker in a push's payload shape so
// they look the same (`registration.showNotification` there: `new Notification()` does not
// exist on Android). What a notification shows and what a click on it does is sw.js's.
//
// The pure parts (the payload of an event, the switch's words, the key's bytes) are tested in
// Node (test/push.test.mjs).

import { hostPort } from "./conversation.js";

// sw.js reads the token from here: database, object store, key (the same names there).
const TOKEN_DB = "warren-worker";
const TOKEN_STORE = "secrets";
const TOKEN_KEY = "token";
/** How long the browser's push service may take to subscribe (a browser without one never
 *  answers). */
const SUBSCRIBE_TIMEOUT_MS = 20000;

// ---- pure ----

/** The bytes of a base64url string (the gateway's VAPID public key). */
export function base64UrlBytes(text) {
  const base64 = text.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(text.length / 4) * 4, "=");
  return Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
}

/** Whether two keys (ArrayBuffer or typed array) hold the same bytes. */
export function sameBytes(a, b) {
  if (!a || !b) return false;
  const x = new Uint8Array(a instanceof ArrayBuffer ? a : a.buffer, a.byteOffset ?? 0, a.byteLength);
  const y = new Uint8Array(b instanceof ArrayBuffer ? b : b.buffer, b.byteOffset ?? 0, b.byteLength);
  return x.length === y.length && x.every((byte, i) => byte === y[i]);
}

const EGRESS_ACTIONS = { allow_once: "Allow once", allow_session: "Allow for this session", deny: "Deny" };

/** The notification payload (the gateway's push shape: `{session, title, kind, text, url,
 *  actions, request}`) of a live event of `session`, or null when the event is not one to say. */
export function payloadForEvent(event, session) {
  const id = session.id;
  const base = { session: id, title: session.title || `Session ${id.slice(0, 8)}`, url: `/#/s/${encodeURIComponent(id)}` };
  const ask = (request, text, actions) => ({
    ...base,
    kind: event.type,
    request,
    text,
    actions,
    url: `${base.url}/r/${encodeURIComponent(request)}`,
  });
  switch (event.type) {
    case "turn_end":
      return { ...base, kind: "turn_end", text: event.stop_reason === "cancelled" ? "The turn was cancelled." : "The agent finished.", actions: [] };
    case "permission_request": {
      const tool = event.tool_call ?? {};
      const what = String(tool.title ?? "").trim() || "a tool";
      const options = Array.isArray(event.options) ? event.options : [];
      return ask(
        event.request_id,
        tool.kind === "execute" || tool.kind === undefined ? `The agent asks to run: ${what}` : `The agent asks to use: ${what}`,
        options.map((option) => ({ id: option.optionId, title: option.name ?? option.optionId })),
      );
    }
    case "egress_request":
      return ask(
        event.request_id,
        `The sandbox wants to reach ${hostPort(event.host, event.port)}`,
        (event.options ?? []).map((option) => ({ id: option, title: EGRESS_ACTIONS[option] ?? option })),
      );
    case "hands":
      if (event.state !== "lost") return null;
      return {
        ...base,
        kind: "hands_lost",
        text: event.error ? `The sandbox was lost: ${event.error}` : "The sandbox was lost; the next use starts it again on the same workspace.",
        actions: [],
      };
    default:
      return null;
  }
}

/**
 * The switch in words, from what is known: `supported` (service worker, push manager and
 * notifications exist), `permission` (Notification.permission), `subscribed` (this browser has
 * a subscription the gateway knows), `busy`, `error` (the last attempt's failure).
 */
export function switchWords({ supported, permission, subscribed, busy = false, error = "" }) {
  if (!supported) {
    return { checked: false, disabled: true, text: "Not available in this browser (on an iPhone, add Warren to the home screen first; it also needs HTTPS)." };
  }
  if (permission === "denied") {
    return { checked: false, disabled: true, text: "Blocked by the browser: allow notifications for this site in its settings, then come back." };
  }
  if (busy) return { checked: subscribed, disabled: true, text: subscribed ? "Turning off…" : "Turning on…" };
  if (error) return { checked: subscribed, disabled: false, text: error };
  return subscribed
    ? { checked: true, disabled: false, text: "On: this device is told of questions, finished turns and lost sandboxes, also when Warren is closed." }
    : { checked: false, disabled: false, text: "Off: this device is told nothing while Warren is closed." };
}

// ---- the worker's token ----

function withStore(mode, use) {
  return new Promise((resolve) => {
    if (!globalThis.indexedDB) return resolve(null);
    const open = indexedDB.open(TOKEN_DB, 1);
    open.onupgradeneeded = () => open.result.createObjectStore(TOKEN_STORE);
    open.onerror = () => resolve(null);
    open.onsuccess = () => {
      const db = open.result;
      const transaction = db.transaction(TOKEN_STORE, mode);
      use(transaction.objectStore(TOKEN_STORE));
      transaction.oncomplete = () => resolve(true);
      transaction.onerror = transaction.onabort = () => resolve(null);
      db.close();
    };
  });
}

/** Keeps `token` where the service worker reads it (at sign-in, and as a signed-in page opens). */
export function saveWorkerToken(token) {
  return withStore("readwrite", (store) => store.put(token, TOKEN_KEY));
}

/** Forgets the worker's token (at sign-out). */
export function forgetWorkerToken() {
  return withStore("readwrite", (store) => store.delete(TOKEN_KEY));
}

// ---- the browser's push subscription ----

function pushSupported() {
  return "serviceWorker" in navigator && "PushManager" in window && "Notification" in window && !!navigator.serviceWorker;
}

/** The service worker's registration, or null (none within a few seconds, or no support). */
async function registration() {
  if (!navigator.serviceWorker) return null;
  return Promise.race([navigator.serviceWorker.ready, new Promise((resolve) => setTimeout(() => resolve(null), 5000))]);
}

async function browserSubscription() {
  const reg = await registration();
  return reg ? reg.pushManager.getSubscription() : null;
}

/** Unsubscribes this browser's push subscription, if any (at sign-out: the gateway drops its
 *  side when the device is revoked). */
export async function dropBrowserSubscription() {
  try {
    const subscription = pushSupported() ? await browserSubscription() : null;
    await subscription?.unsubscribe();
  } catch {
    // nothing to drop
  }
}

/** The "Notifications" switch: `elements.button` (role switch), `elements.status`. */
export class PushSwitch {
  constructor({ elements, api }) {
    this.el = elements;
    this.api = api;
    this.state = { supported: pushSupported(), permission: "default", subscribed: false, busy: false, error: "" };
    this.el.button.addEventListener("click", () => (this.state.subscribed ? this.turnOff() : this.turnOn()));
  }

  /** Reads where things stand: the browser's permission and subscription, and whether the
   *  gateway has it. */
  async refresh() {
    if (!this.state.supported) return this.render();
    this.state.permission = Notification.permission;
    try {
      const subscription = await browserSubscription();
      this.state.subscribed = subscription ? (await this.serverEntry(subscription)) !== null : false;
      this.state.error = "";
    } catch (error) {
      this.state.error = `Could not check: ${error.message}`;
    }
    this.render();
  }

  render() {
    const words = switchWords(this.state);
    this.el.button.setAttribute("aria-checked", String(words.checked));
    this.el.button.disabled = words.disabled;
    this.el.status.textContent = words.text;
  }

  async serverEntry(subscription) {
    const list = await this.api.request("GET", "/v1/push/subscriptions");
    const entries = Array.isArray(list) ? list : (list?.subscriptions ?? []);
    return entries.find((entry) => entry.endpoint === subscription.endpoint) ?? null;
  }

  async turnOn() {
    this.update({ busy: true, error: "" });
    try {
      const permission = await Notification.requestPermission();
      this.state.permission = permission;
      if (permission !== "granted") {
        this.update({ busy: false, error: permission === "denied" ? "" : "Not turned on: the browser's question was not answered." });
        return;
      }
      const { public_key: publicKey } = await this.api.request("GET", "/v1/push/key");
      const key = base64UrlBytes(publicKey);
      const reg = await registration();
      if (!reg) throw new Error("the service worker is not running");
      let subscription = await reg.pushManager.getSubscription();
      // Made for another gateway key (the gateway's data directory is new): useless now.
      if (subscription && !sameBytes(subscription.options.applicationServerKey, key)) {
        await subscription.unsubscribe();
        subscription = null;
      }
      subscription ??= await withTimeout(
        reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key }),
        SUBSCRIBE_TIMEOUT_MS,
        "the browser's push service did not answer",
      );
      if ((await this.serverEntry(subscription)) === null) {
        await this.api.request("POST", "/v1/push/subscriptions", { json: subscription.toJSON() });
      }
      this.update({ busy: false, subscribed: true });
    } catch (error) {
      this.update({ busy: false, subscribed: false, error: `Not turned on: ${reasonOf(error)}` });
    }
  }

  async turnOff() {
    this.update({ busy: true, error: "" });
    try {
      const subscription = await browserSubscription();
      if (subscription) {
        const entry = await this.serverEntry(subscription);
        if (entry) await this.api.request("DELETE", `/v1/push/subscriptions/${encodeURIComponent(entry.id)}`);
        await subscription.unsubscribe();
      }
      this.update({ busy: false, subscribed: false });
    } catch (error) {
      this.update({ busy: false, error: `Not turned off: ${reasonOf(error)}` });
    }
  }

  update(change) {
    Object.assign(this.state, change);
    this.render();
  }
}

function reasonOf(error) {
  // Chromium without a push service (or off the record) says "Registration failed - …".
  if (error?.name === "AbortError" || error?.name === "NotAllowedError") return `the browser refused (${error.message})`;
  return error?.message || String(error);
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([promise, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(what)), ms)))]).finally(() => clearTimeout(timer));
}

// ---- the page's own notifications ----

/** Asks for the permission to notify, once, when the person first sends a message (a tap or a
 *  key: browsers ask only then). */
export function askNotificationPermission() {
  if (!("Notification" in window) || Notification.permission !== "default") return;
  try {
    Notification.requestPermission().catch(() => {});
  } catch {
    // an old callback-only implementation: nothing to do
  }
}

/** What the page does with a live event of the open session: closes the notifications an
 *  answer or the end of a turn made moot, and, while the page is hidden and this browser gets
 *  no pushes, has the service worker say the event. Never throws. */
export async function notifyInTab(event, session) {
  try {
    if (!session || !navigator.serviceWorker) return;
    if (event.type === "permission_resolved" || event.type === "turn_end") {
      await closeNotifications(session.id, event.type === "turn_end" ? null : event.request_id);
    }
    if (!document.hidden || !("Notification" in window) || Notification.permission !== "granted") return;
    const payload = payloadForEvent(event, session);
    if (!payload) return;
    const reg = await registration();
    if (!reg?.active || (await reg.pushManager?.getSubscription())) return; // the gateway's push says it
    reg.active.postMessage({ type: "notify", payload });
  } catch (error) {
    console.warn("notification not shown:", error);
  }
}

/** Closes the request notifications of `sessionId`: the one of `requestId`, or (null) the
 *  agent's questions, which end with their turn. */
async function closeNotifications(sessionId, requestId) {
  const reg = await registration();
  if (!reg?.getNotifications) return;
  for (const shown of await reg.getNotifications()) {
    const data = shown.data ?? {};
    if (data.session !== sessionId || !data.request) continue;
    if (requestId === null ? data.kind === "permission_request" : data.request === requestId) shown.close();
  }
}
