// The console's service worker (phone.md "Installable"), served at /sw.js so that its scope is
// the whole console. It keeps the app shell (the page, its styles and modules, the icons, the
// manifest and the vendored xterm.js) in one cache per shell version, so the console opens
// without a network and says it is offline.
//
// The gateway puts one line before this file as it serves it (console.rs):
//   const WARREN_SHELL = {"version": "<hash of the shell's files>", "files": ["/", "/console/…", …]};
// A new build of the console is a new version: a new worker, which fills a new cache and
// deletes the old one.
//
// What it answers:
// - the page (a navigation to `/`): from the network first, from the cache when there is none;
// - a file of the shell: from the cache first (the cache holds one version of every file, so
//   they always fit together); while the page came from a gateway whose shell is newer than this
//   worker's (its `X-Warren-Shell` header), from the network, until the new worker takes over;
// - nothing else: the API (`/v1/…`, event streams included), WebSockets, previews (other
//   origins) and downloads go to the network as if there were no worker, and are never cached.
//
// It also shows the notifications (phone.md "Push"), the gateway's pushes and the page's own
// (a page that is hidden and has no push subscription posts `{type: "notify", payload}` with a
// push's payload, so both look the same): one per session and request (`tag`
// `<session>:<request or kind>`, so an answer replaces its question), with at most two answer
// buttons for a request. A click on an answer posts it through the API with the device token the
// page keeps for this worker in IndexedDB (the worker cannot read localStorage) and says how it
// went in the same notification; any other click opens the console at the payload's `url`. The
// pure parts (`notificationFor`, `answerFor`, `closes`, `outcomeText`) are tested in Node
// (test/notifications.test.mjs) by running this file with a stand-in `self`.

/* global WARREN_SHELL */
const { version: VERSION, files: FILES } = WARREN_SHELL;
const PREFIX = "warren-shell-";
const CACHE = PREFIX + VERSION;
const SHELL = new Set(FILES);

// Set when a page came from a gateway with another shell version (this worker is outdated).
let outdated = false;

self.addEventListener("install", (event) => {
  event.waitUntil(
    (async () => {
      const cache = await caches.open(CACHE);
      // `no-cache`: revalidated with the gateway, never an older copy from the HTTP cache.
      await cache.addAll(FILES.map((url) => new Request(url, { cache: "no-cache" })));
      await self.skipWaiting();
    })(),
  );
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    (async () => {
      for (const name of await caches.keys()) {
        if (name.startsWith(PREFIX) && name !== CACHE) await caches.delete(name);
      }
      await self.clients.claim();
    })(),
  );
});

self.addEventListener("fetch", (event) => {
  const request = event.request;
  if (request.method !== "GET") return;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin) return;
  if (request.mode === "navigate" && url.pathname === "/") {
    event.respondWith(page(request));
  } else if (SHELL.has(url.pathname) && url.search === "") {
    event.respondWith(shellFile(request));
  }
  // Anything else is not answered here: the browser goes to the network as usual.
});

async function page(request) {
  try {
    const response = await fetch(request);
    const served = response.headers.get("X-Warren-Shell");
    if (served && served !== VERSION) {
      outdated = true;
      self.registration.update().catch(() => {});
    }
    return response;
  } catch (error) {
    const cached = await caches.match("/", { cacheName: CACHE, ignoreSearch: true, ignoreVary: true });
    if (cached) return cached;
    throw error;
  }
}

async function shellFile(request) {
  if (!outdated) {
    const cached = await caches.match(request, { cacheName: CACHE, ignoreVary: true });
    if (cached) return cached;
  }
  return fetch(request);
}

// ---- notifications (phone.md "Push") ----

// The page's store for this worker (push.js writes it): database, object store, key.
const TOKEN_DB = "warren-worker";
const TOKEN_STORE = "secrets";
const TOKEN_KEY = "token";

const REQUEST_KINDS = new Set(["permission_request", "egress_request"]);

/** The notification's tag: one per session and request (or kind, for the rest). */
function notificationTag(payload) {
  return `${payload.session}:${payload.request ?? payload.kind}`;
}

/** Whether `payload` asks a question that can be answered from the notification. */
function isRequest(payload) {
  return REQUEST_KINDS.has(payload.kind) && typeof payload.request === "string" && payload.request !== "";
}

/** The answer buttons for `actions` ([{id, title}]) when a notification shows at most `max`:
 *  all of them when they fit, else the first and the last (allow comes first and refuse last,
 *  both in ACP's options and in the network's: "Allow once" … "Deny"). */
function pickActions(actions, max) {
  const valid = (Array.isArray(actions) ? actions : []).filter((action) => action && typeof action.id === "string" && action.id !== "");
  if (max <= 0) return [];
  if (valid.length <= max) return valid;
  return max === 1 ? valid.slice(0, 1) : [valid[0], valid[valid.length - 1]];
}

/** `{title, options}` for `showNotification` from a push payload (`{session, title, kind,
 *  text, url, actions, request}`); `maxActions`: how many buttons the browser shows. */
function notificationFor(payload, maxActions = 2) {
  const request = isRequest(payload);
  const actions = request ? pickActions(payload.actions, maxActions) : [];
  return {
    title: payload.title || "Warren",
    options: {
      body: payload.text ?? "",
      tag: notificationTag(payload),
      data: payload,
      actions: actions.map((action) => ({ action: action.id, title: action.title || action.id })),
      // A question asked again (or another one of the same request) is said again, and stays
      // until it is answered or dismissed.
      renotify: request,
      requireInteraction: request,
      icon: "/console/icons/icon-192.png",
    },
  };
}

/** The API call that answers `payload`'s request with the option `actionId`, or null when the
 *  payload asks nothing or offered no such option. */
function answerFor(payload, actionId) {
  if (!isRequest(payload) || !payload.session) return null;
  if (!(payload.actions ?? []).some((action) => action?.id === actionId)) return null;
  return {
    method: "POST",
    path: `/v1/sessions/${encodeURIComponent(payload.session)}/permissions/${encodeURIComponent(payload.request)}`,
    body: { option_id: actionId },
  };
}

/** Whether the notification whose data is `shown` is made moot by `payload`: the request it
 *  names is resolved (`payload.resolved`, one request id or several), or the session's turn
 *  ended or its hands were lost (an agent's question belongs to its turn; a network question
 *  does not, and stays). */
function closes(payload, shown) {
  if (!shown || shown.session !== payload.session || !shown.request) return false;
  const resolved = [payload.resolved ?? []].flat();
  if (resolved.includes(shown.request)) return true;
  return (payload.kind === "turn_end" || payload.kind === "hands_lost") && shown.kind === "permission_request";
}

/** What the notification says after an answer was sent: `status` of the API's answer (0: none
 *  came), its error `code`, the chosen option's `title`. */
function outcomeText(status, code, title) {
  if (status >= 200 && status < 300) return `Answered: ${title}`;
  if (status === 0) return `Not answered: the gateway did not answer. Open Warren to answer.`;
  if (status === 401) return "Not answered: this browser is signed out. Open Warren to sign in again.";
  if (code === "PERMISSION_NOT_FOUND") return "Already answered, or no longer asked.";
  if (code === "SESSION_NOT_FOUND") return "Not answered: the session is gone.";
  return `Not answered (${code || `HTTP ${status}`}). Open Warren to answer.`;
}

/** `event.waitUntil(work)`: the worker stays up until the work is done. An event a script
 *  dispatched itself cannot be extended (it throws); its work runs all the same. */
function keepAlive(event, work) {
  try {
    event.waitUntil(work);
  } catch {
    // not dispatched by the browser
  }
}

function maxActions() {
  return Math.min(2, globalThis.Notification?.maxActions ?? 2);
}

/** Shows the notification of `payload` after closing the ones it makes moot. */
async function showPayload(payload) {
  if (!payload || typeof payload !== "object" || typeof payload.session !== "string") {
    // Something arrived that this console cannot read: still said, since a push must show.
    await self.registration.showNotification("Warren", { body: "Something happened in a session.", tag: "warren" });
    return;
  }
  for (const shown of await self.registration.getNotifications()) {
    if (closes(payload, shown.data)) shown.close();
  }
  if (payload.kind === "resolved") return;
  const { title, options } = notificationFor(payload, maxActions());
  await self.registration.showNotification(title, options);
}

self.addEventListener("push", (event) => {
  let payload = null;
  try {
    payload = event.data?.json() ?? null;
  } catch {
    payload = null;
  }
  keepAlive(event, showPayload(payload));
});

self.addEventListener("message", (event) => {
  if (event.data?.type === "notify") keepAlive(event, showPayload(event.data.payload));
});

self.addEventListener("notificationclick", (event) => {
  const notification = event.notification;
  const payload = notification.data ?? {};
  const answer = event.action ? answerFor(payload, event.action) : null;
  if (answer) {
    keepAlive(event, sendAnswer(payload, event.action, answer));
  } else {
    notification.close();
    keepAlive(event, openConsole(payload.url));
  }
});

/** Posts `answer` with the page's device token, saying so in the request's notification
 *  (replaced under its tag, never closed first: the browser may carry out a close after the
 *  next one with that tag is up, and take that one away), then how it went. */
async function sendAnswer(payload, actionId, answer) {
  const title = payload.actions.find((action) => action.id === actionId)?.title ?? actionId;
  const said = (body, url) =>
    self.registration.showNotification(payload.title || "Warren", {
      body,
      tag: notificationTag(payload),
      // No `request`: a page that sees the answer arrive leaves this one alone. A click on it
      // opens the session (its request answered), or the request to answer it there.
      data: { session: payload.session, title: payload.title, kind: "answer", url },
      icon: "/console/icons/icon-192.png",
    });
  // At once, in place of the question: the click did something.
  await said(`Answering: ${title}…`, payload.url);
  const token = await readToken();
  let status = 401;
  let code = "UNAUTHORIZED";
  if (token) {
    try {
      const response = await fetch(answer.path, {
        method: answer.method,
        headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
        body: JSON.stringify(answer.body),
      });
      status = response.status;
      code = response.ok ? "" : ((await response.json().catch(() => null))?.code ?? "");
    } catch {
      status = 0;
      code = "NETWORK";
    }
  }
  const answered = status >= 200 && status < 300;
  await said(outcomeText(status, code, title), answered ? `/#/s/${encodeURIComponent(payload.session)}` : payload.url);
}

/** Focuses a console window and takes it to `url` (a path of this origin), or opens one. */
async function openConsole(url) {
  // A link of this console only: a payload is data, it does not choose where a click goes.
  let target = new URL("/", self.location.origin).href;
  try {
    const link = new URL(url, self.location.origin);
    if (link.origin === self.location.origin) target = link.href;
  } catch {
    // no link, or not one: the console's start
  }
  const windows = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const client = windows.find((w) => w.focused) ?? windows.find((w) => w.visibilityState === "visible") ?? windows[0];
  if (client) {
    // A browser lets a worker focus a window only right after a click on its notification.
    await client.focus().catch(() => {});
    const navigated = await client.navigate(target).catch(() => null);
    if (navigated) return;
  }
  await self.clients.openWindow(target);
}

/** The device token the page saved for this worker, or null. */
function readToken() {
  return new Promise((resolve) => {
    let open;
    try {
      open = indexedDB.open(TOKEN_DB, 1);
    } catch {
      resolve(null);
      return;
    }
    open.onupgradeneeded = () => open.result.createObjectStore(TOKEN_STORE);
    open.onerror = () => resolve(null);
    open.onsuccess = () => {
      const db = open.result;
      try {
        const get = db.transaction(TOKEN_STORE, "readonly").objectStore(TOKEN_STORE).get(TOKEN_KEY);
        get.onsuccess = () => resolve(typeof get.result === "string" ? get.result : null);
        get.onerror = () => resolve(null);
      } catch {
        resolve(null);
      } finally {
        db.close();
      }
    };
  });
}
