// The console's entry point: sign-in (register this browser as a device with the app key, join
// with a pairing code, or paste a device token; the token is kept in localStorage; sign-out is
// asked first and revokes the device: devices.js), the session list, the open
// session's header (with a warning when its hands run unconfined or share the host's network)
// and its six views (Chat, Terminal, Files, Preview, Network, Checkpoints), and the location
// (route.js): every move into a session, a view, a folder, a file or a checkpoint's changes or
// files is a history entry, so that Back goes back through them and from a session to the list,
// never out of the console, and a reload comes back to the same place; `#/s/<id>/r/<request_id>`
// (a notification's link) opens the session's chat at that request. The "Session title" box
// names a new session; "Rename session" renames the open one (`PATCH`); a fork (checkpoints.js)
// is a new session, opened at once.

import { ApiError, createApi } from "./api.js";
import { ChatView } from "./chat.js";
import { CheckpointsView } from "./checkpoints.js";
import { AccountPanel, JoinForm, pairCodeFromHash, pairLinkWhileSignedIn } from "./devices.js";
import { dropBrowserSubscription, forgetWorkerToken, saveWorkerToken } from "./push.js";
import { FilesView } from "./files.js";
import { NetworkView } from "./network.js";
import { PreviewView } from "./preview.js";
import { TerminalView } from "./terminal.js";
import { handsWords, stateWords } from "./render.js";
import { VIEWS, parseRoute, routeHash, sameRoute, sessionRoute } from "./route.js";
import { watchViewport } from "./viewport.js";
import "./install.js"; // the service worker (offline use, installing the app) and the offline state

const TOKEN_KEY = "warren.token";
const $ = (id) => document.getElementById(id);

// What the sign-in screen says when the token stopped working.
const SIGNED_OUT_ELSEWHERE =
  "This browser was signed out: its token no longer works (another of your devices revoked it, or it expired). Pair it again from a signed-in device, or register it with the app key.";

// One API object whose token changes at sign-in and sign-out; the views keep a reference to it.
// A 401 means the token stopped working (revoked by another device, expired): signed out.
const api = {
  token: localStorage.getItem(TOKEN_KEY),
  request(method, path, options) {
    const token = api.token;
    return createApi({ token }).request(method, path, options).catch((error) => {
      if (error.status === 401 && token && api.token === token) signOut(SIGNED_OUT_ELSEWHERE);
      throw error;
    });
  },
};

const state = { sessions: [], session: null, view: "chat", sessionsLoaded: false };

const connection = $("connection");
const chat = new ChatView({
  elements: {
    log: $("log"),
    form: $("composer"),
    message: $("message"),
    cancel: $("cancel"),
    error: $("chat-error"),
    prompt: $("prompt"),
    promptText: $("prompt-text"),
    promptAnswer: $("prompt-answer"),
    promptError: $("prompt-error"),
    offer: $("chat-offer"),
    offerText: $("chat-offer-text"),
    offerSend: $("chat-offer-send"),
  },
  api,
  onEvent: sessionEvent,
  onStatus: (status) => {
    connection.textContent = status;
    connection.dataset.status = status;
  },
  onWatch: (name) => {
    if (state.session) go(sessionRoute(state.session.id, "terminal"));
    terminal.watch(name);
  },
  onCheckpoint: (id) => state.session && go(sessionRoute(state.session.id, "checkpoints", { checkpoint: id, show: "diff" })),
  onOpenSession: (id) => go(sessionRoute(id, "chat")),
  sessionTitle: (id) => knownTitle(id),
});
const terminal = new TerminalView({
  elements: {
    region: $("term"),
    status: $("term-status"),
    takeover: $("takeover"),
    mine: $("term-mine"),
    keybar: $("keybar"),
    agents: $("agent-terminals"),
    refresh: $("term-refresh"),
  },
  api,
});
const files = new FilesView({
  elements: {
    panel: $("panel-files"),
    list: $("files"),
    path: $("files-path"),
    up: $("files-up"),
    upload: $("upload"),
    input: $("upload-input"),
    newFolder: $("new-folder"),
    progress: $("upload-progress"),
    progressBar: $("upload-bar"),
    progressText: $("upload-text"),
    error: $("files-error"),
    viewer: $("file-viewer"),
    viewerName: $("viewer-name"),
    viewerNote: $("viewer-note"),
    viewerBody: $("viewer-body"),
    viewerWrap: $("viewer-wrap"),
    viewerDownload: $("viewer-download"),
    viewerClose: $("viewer-close"),
  },
  api,
  onNavigate: (place) => state.session && go(sessionRoute(state.session.id, "files", place)),
  onClose: () => closeFile(),
});
const preview = new PreviewView({
  elements: { form: $("preview-form"), port: $("preview-port"), frame: $("preview-frame"), open: $("preview-open"), live: $("previews"), error: $("preview-error") },
  api,
});
const network = new NetworkView({
  elements: {
    mode: $("network-mode"),
    error: $("network-error"),
    policy: $("network-policy"),
    policyHelp: $("network-policy-help"),
    allowList: $("allow-rules"),
    allowForm: $("allow-form"),
    allowInput: $("allow-rule"),
    allowError: $("allow-error"),
    denyList: $("deny-rules"),
    denyForm: $("deny-form"),
    denyInput: $("deny-rule"),
    denyError: $("deny-error"),
    recent: $("egress-recent"),
    credentials: $("network-credentials"),
    refresh: $("network-refresh"),
  },
  api,
});
// A checkpoint's files: the Files view's listing and viewer, read-only, in the Checkpoints view.
const checkpointFiles = new FilesView({
  elements: {
    panel: $("checkpoint-files"),
    list: $("checkpoint-files-list"),
    path: $("checkpoint-files-path"),
    up: $("checkpoint-files-up"),
    error: $("checkpoint-files-error"),
    viewer: $("checkpoint-file-viewer"),
    viewerName: $("checkpoint-viewer-name"),
    viewerNote: $("checkpoint-viewer-note"),
    viewerBody: $("checkpoint-viewer-body"),
    viewerWrap: $("checkpoint-viewer-wrap"),
    viewerDownload: $("checkpoint-viewer-download"),
    viewerClose: $("checkpoint-viewer-close"),
  },
  api,
  readOnly: true,
  onNavigate: (place) => state.session && go(sessionRoute(state.session.id, "checkpoints", { checkpoint: checkpoints.checkpoint, show: "files", ...place })),
  onClose: () => closeFile(),
});
const checkpoints = new CheckpointsView({
  elements: {
    panel: $("panel-checkpoints"),
    home: $("checkpoints-home"),
    list: $("checkpoints"),
    more: $("checkpoints-more"),
    refresh: $("checkpoints-refresh"),
    note: $("checkpoints-note"),
    error: $("checkpoints-error"),
    diff: $("checkpoint-diff"),
    diffTitle: $("checkpoint-diff-title"),
    diffMeta: $("checkpoint-diff-meta"),
    diffBody: $("checkpoint-diff-body"),
    diffClose: $("checkpoint-diff-close"),
    browser: $("checkpoint-files"),
    browserTitle: $("checkpoint-files-title"),
    browserClose: $("checkpoint-files-close"),
  },
  api,
  files: checkpointFiles,
  onNavigate: (place) => state.session && go(sessionRoute(state.session.id, "checkpoints", place)),
  onClose: () => closeCheckpoint(),
  onForked: (session) => {
    state.sessions.unshift(session);
    renderSessions();
    go(sessionRoute(session.id, "chat"));
  },
  sessionTitle: (id) => knownTitle(id),
});
const viewObjects = { chat, terminal, files, preview, network, checkpoints };

// ---- sign-in ----

function suggestDeviceName() {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  const suffix = [...bytes].map((b) => "abcdefghijkmnpqrstuvwxyz23456789"[b % 32]).join("");
  const kind = matchMedia("(pointer: coarse)").matches ? "phone" : "browser";
  return `${kind}-${suffix}`;
}

function showSignIn(message = "") {
  $("signin").hidden = false;
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("account-open").hidden = true;
  account.reset();
  connection.textContent = "";
  $("device-name").value = suggestDeviceName();
  // Why this browser is signed out, at the top; the forms' own errors go.
  showError($("signin-note"), message);
  showError($("signin-error"), "");
  showError($("join-error"), "");
  $("signin").scrollTop = 0;
  join.fill(pairCodeFromHash(location.hash));
}

// The Account panel (devices, pairing, notifications) and the sign-in screen's pairing code.
const account = new AccountPanel({ api });
const join = new JoinForm({ onJoined: (token) => signIn(token), showError: (text) => showError($("join-error"), text) });

/** A `#/pair/<code>` link: the sign-in screen with the code filled in, or (signed in already)
 *  a word that this browser does not need it. */
function openPairLink(code) {
  if (!api.token) return showSignIn();
  history.replaceState(null, "", location.pathname);
  showApp();
  pairLinkWhileSignedIn(code);
}

window.addEventListener("hashchange", () => {
  const code = pairCodeFromHash(location.hash);
  if (code !== "") openPairLink(code);
});

$("register-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const deviceId = $("device-name").value.trim();
  if (!/^[A-Za-z0-9_-]{8,128}$/.test(deviceId)) {
    showError($("signin-error"), "A device name is 8 to 128 letters, digits, - or _.");
    return;
  }
  try {
    const answer = await createApi({}).request("POST", "/v1/devices", {
      json: { device_id: deviceId },
      headers: { "X-App-Key": $("app-key").value.trim() },
    });
    $("app-key").value = "";
    signIn(answer.token);
  } catch (error) {
    const why = {
      DEVICE_ALREADY_BOUND: "That device name is taken. Another one is suggested; press Register again.",
      UNAUTHORIZED: "The app key is not right.",
      INVALID_DEVICE_ID: "A device name is 8 to 128 letters, digits, - or _.",
      DEVICE_REVOKED: "That device name was signed out for good. Another one is suggested; press Register again.",
    }[error.code];
    if (error.code === "DEVICE_ALREADY_BOUND" || error.code === "DEVICE_REVOKED") $("device-name").value = suggestDeviceName();
    showError($("signin-error"), why ?? `Registration failed: ${error.message}`);
  }
});

$("token-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const token = $("device-token").value.trim();
  try {
    await createApi({ token }).request("GET", "/v1/sessions");
  } catch (error) {
    showError($("signin-error"), error.status === 401 ? "That token does not work." : `Sign-in failed: ${error.message}`);
    return;
  }
  $("device-token").value = "";
  signIn(token);
});

function signIn(token) {
  api.token = token;
  localStorage.setItem(TOKEN_KEY, token);
  saveWorkerToken(token); // for the service worker's answers from a notification
  showApp();
}

// Asked first: the confirmation says what it costs, and revokes this device on the gateway.
$("sign-out").addEventListener("click", async () => {
  if (await account.confirmSignOut()) signOut();
});

function signOut(message = "") {
  closeSession();
  api.token = null;
  localStorage.removeItem(TOKEN_KEY);
  forgetWorkerToken();
  dropBrowserSubscription();
  history.replaceState(null, "", location.pathname);
  showSignIn(message);
}

// ---- sessions ----

async function showApp() {
  $("signin").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  $("account-open").hidden = false;
  await loadSessions();
  startRoute();
}

async function loadSessions() {
  try {
    const answer = await api.request("GET", "/v1/sessions");
    state.sessions = answer.sessions ?? [];
    state.sessionsLoaded = true;
    showError($("sessions-error"), "");
  } catch (error) {
    if (error.status === 401) return; // signed out (api.request)
    showError($("sessions-error"), `Could not load the sessions: ${error.message}`);
    return;
  }
  state.sessions.sort((a, b) => (b.created_at ?? "").localeCompare(a.created_at ?? ""));
  renderSessions();
}

function renderSessions() {
  const list = $("sessions");
  list.replaceChildren(
    ...state.sessions.map((session) => {
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "session-item";
      button.dataset.session = session.id;
      if (state.session?.id === session.id) button.setAttribute("aria-current", "true");
      const title = document.createElement("span");
      title.className = "title";
      title.textContent = titleOf(session);
      // The title alone names the button; the rest describes it.
      const meta = document.createElement("span");
      meta.className = "meta";
      meta.id = `meta-${session.id}`;
      meta.setAttribute("aria-hidden", "true");
      meta.textContent = listWords(session);
      button.setAttribute("aria-describedby", meta.id);
      button.append(title, meta);
      item.append(button);
      return item;
    }),
  );
  if (state.sessions.length === 0) {
    const empty = document.createElement("li");
    empty.className = "meta";
    empty.textContent = "No sessions yet.";
    list.append(empty);
  }
}

$("sessions").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-session]");
  const session = button && state.sessions.find((s) => s.id === button.dataset.session);
  if (session) go(sessionRoute(session.id, "chat"));
});

$("new-session-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const box = $("session-title");
  const title = box.value.trim() || `Session ${new Date().toLocaleString([], { dateStyle: "medium", timeStyle: "short" })}`;
  let session;
  try {
    session = await api.request("POST", "/v1/sessions", { json: { title } });
  } catch (error) {
    showError($("sessions-error"), error.code === "QUOTA_EXCEEDED" ? "This device has as many sessions as it may: delete one first." : `No new session: ${error.message}`);
    return;
  }
  box.value = "";
  state.sessions.unshift(session);
  renderSessions();
  go(sessionRoute(session.id, "chat"));
});

$("delete-session").addEventListener("click", async () => {
  const session = state.session;
  if (!session || !confirm(`Delete the session “${titleOf(session)}”, its conversation and its files?`)) return;
  // Its event stream ends as it goes: not followed meanwhile, so that no reconnect asks for a
  // session that is gone.
  chat.pause();
  try {
    await api.request("DELETE", `/v1/sessions/${session.id}`);
  } catch (error) {
    if (!(error instanceof ApiError && error.code === "SESSION_NOT_FOUND")) {
      chat.resume();
      showError($("chat-error"), `Not deleted: ${error.message}`);
      return;
    }
  }
  closeSession();
  state.sessions = state.sessions.filter((s) => s.id !== session.id);
  renderSessions();
  backToList();
});

$("rename-session").addEventListener("click", () => {
  const form = $("rename-form");
  form.hidden = !form.hidden;
  if (form.hidden || !state.session) return;
  $("rename-title").value = titleOf(state.session);
  $("rename-title").focus();
});

$("rename-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const session = state.session;
  const title = $("rename-title").value.trim();
  if (!session || !title) return;
  let renamed;
  try {
    renamed = await api.request("PATCH", `/v1/sessions/${session.id}`, { json: { title } });
  } catch (error) {
    showError($("chat-error"), `Not renamed: ${error.message}`);
    return;
  }
  Object.assign(session, renamed);
  state.sessions = state.sessions.map((s) => (s.id === session.id ? session : s));
  $("rename-form").hidden = true;
  renderSessionHead();
  renderSessions();
});

$("back").addEventListener("click", () => backToList());

function showList() {
  // On a phone the list replaces the session; the views let go of the terminal either way.
  $("app").dataset.view = "list";
  if (state.session && matchMedia("(max-width: 799px)").matches) viewObjects[state.view].hide();
  if (!state.session) {
    $("session").hidden = true;
    $("no-session").hidden = false;
  }
  loadSessions();
}

/** Opens `session` at `route`'s view, and its place there (the Files view's folder and file, the
 *  Checkpoints view's checkpoint). */
function openSession(session, route) {
  if (state.session?.id !== session.id) {
    closeSession();
    state.session = session;
    terminal.setSession(session.id);
    files.setSession(session.id);
    preview.setSession(session.id);
    network.setSession(session.id);
    checkpoints.setSession(session.id);
    chat.open(session);
  }
  $("no-session").hidden = true;
  $("session").hidden = false;
  $("app").dataset.view = "session";
  renderSessionHead();
  renderSessions();
  if (route.view === "files") files.goTo(route);
  if (route.view === "checkpoints") checkpoints.goTo(route);
  selectView(route.view);
}

function closeSession() {
  $("rename-form").hidden = true;
  if (!state.session) return;
  for (const name of VIEWS) viewObjects[name].hide();
  chat.close();
  terminal.setSession(null);
  network.setSession(null);
  checkpoints.setSession(null);
  state.session = null;
  $("session").hidden = true;
  $("no-session").hidden = false;
}

function renderSessionHead() {
  const session = state.session;
  $("session-heading").textContent = titleOf(session);
  $("session-state").textContent = stateWords(session);
  $("isolation-warning").hidden = session.isolation !== "none";
  $("network-warning").hidden = session.network !== "host";
}

/** Keeps the open session's state words current from its live events (the session object is
 *  newer than the history being replayed). */
function sessionEvent(event, live) {
  const session = state.session;
  if (!session || !live) return;
  switch (event.type) {
    case "turn_start":
      session.status = "running";
      break;
    case "turn_end":
      session.status = "idle";
      break;
    case "status":
      session.brain = event.brain;
      break;
    case "hands":
      session.hands = event.state;
      if (event.isolation) session.isolation = event.isolation;
      break;
    case "files_changed":
      files.filesChanged(event.paths ?? [], event.truncated ?? false);
      return;
    case "checkpoint":
      checkpoints.changed();
      return;
    case "rewound":
      // Rewound here or on another device: the files are the checkpoint's now.
      files.filesChanged([], true);
      checkpoints.changed();
      return;
    case "egress":
    case "egress_request":
    case "permission_resolved":
      // A destination used or refused, a question asked or answered ("allow for this session"
      // adds a rule): the Network view's lists may have changed.
      network.changed();
      return;
    default:
      return;
  }
  if (typeof event.turn === "number") session.turn = Math.max(session.turn ?? 0, event.turn);
  renderSessionHead();
  renderSessions();
}

// ---- views ----

const tabs = VIEWS.map((name) => $(`tab-${name}`));
for (const tab of tabs) {
  tab.addEventListener("click", () => goToView(tab.id.slice(4)));
  tab.addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (!step) return;
    const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
    next.focus();
    goToView(next.id.slice(4));
  });
}

/** A tab: the open session's view `name` (the Files view at its folder and file; the
 *  Checkpoints view at its list, a checkpoint's changes and files being a step away from it). */
function goToView(name) {
  if (state.session) go(sessionRoute(state.session.id, name, name === "files" ? files.place() : {}));
}

function selectView(name) {
  if (!state.session) return;
  const previous = state.view;
  state.view = name;
  for (const view of VIEWS) {
    const selected = view === name;
    $(`tab-${view}`).setAttribute("aria-selected", String(selected));
    $(`tab-${view}`).tabIndex = selected ? 0 : -1;
    // A screen too narrow for every tab scrolls them: the selected one is in view.
    if (selected) $(`tab-${view}`).scrollIntoView({ block: "nearest", inline: "nearest" });
    $(`panel-${view}`).hidden = !selected;
  }
  if (previous !== name) viewObjects[previous].hide();
  viewObjects[name].show();
}

// ---- the location: history entries (route.js) ----
// Each entry the console pushes carries `{warren: depth}`, its distance from the list's entry
// below it, and `from`, the hash it was pushed from; the list's own entry has depth 0. So
// "Sessions" goes back `depth` entries to the list, and closing a file goes back to the folder
// it was opened from, instead of piling up entries.

let depth = 0;

const pageUrl = (hash) => location.pathname + location.search + hash;
const isPhone = () => matchMedia("(max-width: 799px)").matches;

/** Goes to `route`: a new history entry (unless it is where the console is), then shown. */
function go(route) {
  const from = location.hash;
  if (!sameRoute(route, parseRoute(from))) {
    depth += 1;
    history.pushState({ warren: depth, from }, "", pageUrl(routeHash(route)));
  }
  showRoute(route);
}

/** Back to the session list: back through the entries above it, or (none) the list in place. */
function backToList() {
  if (depth > 0) {
    history.go(-depth); // `popstate` shows the list
    return;
  }
  history.replaceState({ warren: 0 }, "", pageUrl(""));
  showRoute({ kind: "list" });
}

/** Closes the open file (of the workspace or of a checkpoint): back to the folder it was opened
 *  from, or to the folder anew. */
function closeFile() {
  const route = parseRoute(location.hash);
  if (route.kind !== "session") return files.goTo({ dir: files.dir, file: null });
  const folder = { ...route, file: null };
  if (route.file && history.state?.from === routeHash(folder)) history.back();
  else go(folder);
}

/** Leaves a checkpoint's changes or files: back to where they were opened from (the list, or
 *  the Chat's "N files changed"), or to the list anew. */
function closeCheckpoint() {
  const route = parseRoute(location.hash);
  if (route.kind !== "session") return;
  const from = parseRoute(history.state?.from ?? "");
  if (from.kind === "session" && from.id === route.id && from.checkpoint === null) history.back();
  else go(sessionRoute(route.id, "checkpoints"));
}

/** The page's first route (after sign-in, or as it loads signed in). */
function startRoute() {
  const route = parseRoute(location.hash);
  if (typeof history.state?.warren === "number") depth = history.state.warren; // a reload
  else adoptEntry(route);
  showRoute(route);
}

/** An entry the console did not make (the page opened at a link, or a link or a typed address
 *  followed in it) becomes one of its own: a session's goes on top of a list entry made of it,
 *  so that Back leads to the list and not out of the console. */
function adoptEntry(route) {
  depth = 0;
  if (route.kind === "session") {
    const hash = location.hash;
    history.replaceState({ warren: 0 }, "", pageUrl(""));
    history.pushState({ warren: 1, from: "" }, "", pageUrl(hash));
    depth = 1;
  } else if (route.kind === "list") {
    history.replaceState({ warren: 0 }, "", pageUrl(""));
  }
}

window.addEventListener("popstate", (event) => {
  if (!api.token || $("app").hidden) return;
  const route = parseRoute(location.hash);
  if (typeof event.state?.warren === "number") depth = event.state.warren;
  else adoptEntry(route);
  showRoute(route);
});

/** Shows `route` (no history entry). A hash of someone else's (`#/pair/…`) is left as it is. */
function showRoute(route) {
  if (route.kind !== "session") {
    // The list: on a wide screen, beside no session.
    if (state.session && !isPhone()) closeSession();
    showList();
    return;
  }
  const session = state.sessions.find((s) => s.id === route.id);
  if (!session) {
    if (state.sessionsLoaded) {
      showError($("sessions-error"), "That session does not exist any more.");
      history.replaceState({ warren: 0 }, "", pageUrl(""));
      depth = 0;
    }
    showList();
    return;
  }
  openSession(session, route);
  if (route.requestId) chat.reveal(route.requestId);
  // Said the console's way (`#/s/…` links become `#session=…`), in the same entry.
  const hash = routeHash(route);
  if (location.hash !== hash) history.replaceState(history.state, "", pageUrl(hash));
}

// ---- words ----

function titleOf(session) {
  return session.title || `Session ${session.id.slice(0, 8)}`;
}

/** The title of the listed session `id`, or null (not one of this device's, or deleted). */
function knownTitle(id) {
  const session = state.sessions.find((s) => s.id === id);
  return session ? titleOf(session) : null;
}

function listWords(session) {
  const turns = session.turn === 1 ? "1 turn" : `${session.turn ?? 0} turns`;
  const created = session.created_at ? new Date(session.created_at).toLocaleDateString([], { month: "short", day: "numeric" }) : "";
  return [session.status === "running" ? "working" : "idle", `hands ${handsWords(session.hands)}`, turns, created && `created ${created}`].filter(Boolean).join(" · ");
}

function showError(element, text) {
  element.textContent = text;
  element.hidden = text === "";
}

// ---- start ----

watchViewport(); // the on-screen keyboard: the page fits what it leaves (app.css)

if (api.token) saveWorkerToken(api.token); // a browser signed in before the worker kept it
if (pairCodeFromHash(location.hash) !== "") openPairLink(pairCodeFromHash(location.hash));
else if (api.token) showApp();
else showSignIn();
