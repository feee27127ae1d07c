// The console's entry point: sign-in (register this browser as a device with the app key, or
// paste a device token; the token is kept in localStorage), the session list, the open
// session's header (with a warning when its hands run unconfined or share the host's network)
// and its five views (Chat, Terminal, Files, Preview, Network), and the location hash
// (`#session=<id>&view=<name>`) so that a reload comes back to the same place. The "Session
// title" box names a new session; "Rename session" renames the open one (`PATCH`).

import { ApiError, createApi } from "./api.js";
import { ChatView } from "./chat.js";
import { FilesView } from "./files.js";
import { NetworkView } from "./network.js";
import { PreviewView } from "./preview.js";
import { TerminalView } from "./terminal.js";
import { handsWords, stateWords } from "./render.js";
import "./install.js"; // the service worker (offline use, installing the app) and the offline state

const TOKEN_KEY = "warren.token";
const $ = (id) => document.getElementById(id);

// One API object whose token changes at sign-in and sign-out; the views keep a reference to it.
const api = {
  token: localStorage.getItem(TOKEN_KEY),
  request(method, path, options) {
    return createApi({ token: api.token }).request(method, path, options);
  },
};

const state = { sessions: [], session: null, view: "chat" };
const VIEWS = ["chat", "terminal", "files", "preview", "network"];

const connection = $("connection");
const chat = new ChatView({
  elements: { log: $("log"), form: $("composer"), message: $("message"), cancel: $("cancel"), error: $("chat-error") },
  api,
  onEvent: sessionEvent,
  onStatus: (status) => {
    connection.textContent = status;
    connection.dataset.status = status;
  },
  onWatch: (name) => {
    selectView("terminal");
    terminal.watch(name);
  },
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
  },
  api,
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
const viewObjects = { chat, terminal, files, preview, network };

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
  connection.textContent = "";
  $("device-name").value = suggestDeviceName();
  showError($("signin-error"), message);
}

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
    }[error.code];
    if (error.code === "DEVICE_ALREADY_BOUND") $("device-name").value = suggestDeviceName();
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
  showApp();
}

$("sign-out").addEventListener("click", () => signOut());

function signOut(message = "") {
  closeSession();
  api.token = null;
  localStorage.removeItem(TOKEN_KEY);
  history.replaceState(null, "", location.pathname);
  showSignIn(message);
}

// ---- sessions ----

async function showApp() {
  $("signin").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  await loadSessions();
  const route = new URLSearchParams(location.hash.slice(1));
  const wanted = state.sessions.find((s) => s.id === route.get("session"));
  if (wanted) openSession(wanted, VIEWS.includes(route.get("view")) ? route.get("view") : "chat");
  else showList();
}

async function loadSessions() {
  try {
    const answer = await api.request("GET", "/v1/sessions");
    state.sessions = answer.sessions ?? [];
    showError($("sessions-error"), "");
  } catch (error) {
    if (error.status === 401) return signOut("This browser's token no longer works: register it again.");
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
  if (session) openSession(session, "chat");
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
  openSession(session, "chat");
});

$("delete-session").addEventListener("click", async () => {
  const session = state.session;
  if (!session || !confirm(`Delete the session “${titleOf(session)}”, its conversation and its files?`)) return;
  try {
    await api.request("DELETE", `/v1/sessions/${session.id}`);
  } catch (error) {
    if (!(error instanceof ApiError && error.code === "SESSION_NOT_FOUND")) {
      showError($("chat-error"), `Not deleted: ${error.message}`);
      return;
    }
  }
  closeSession();
  state.sessions = state.sessions.filter((s) => s.id !== session.id);
  renderSessions();
  showList();
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

$("back").addEventListener("click", () => showList());

function showList() {
  // On a phone the list replaces the session; the views let go of the terminal either way.
  $("app").dataset.view = "list";
  if (state.session && matchMedia("(max-width: 799px)").matches) viewObjects[state.view].hide();
  if (!state.session) {
    $("session").hidden = true;
    $("no-session").hidden = false;
    history.replaceState(null, "", location.pathname);
  }
  loadSessions();
}

function openSession(session, view) {
  if (state.session?.id !== session.id) {
    closeSession();
    state.session = session;
    terminal.setSession(session.id);
    files.setSession(session.id);
    preview.setSession(session.id);
    network.setSession(session.id);
    chat.open(session);
  }
  $("no-session").hidden = true;
  $("session").hidden = false;
  $("app").dataset.view = "session";
  renderSessionHead();
  renderSessions();
  selectView(view);
}

function closeSession() {
  $("rename-form").hidden = true;
  if (!state.session) return;
  for (const name of VIEWS) viewObjects[name].hide();
  chat.close();
  terminal.setSession(null);
  network.setSession(null);
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
      files.filesChanged();
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
  tab.addEventListener("click", () => selectView(tab.id.slice(4)));
  tab.addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (!step) return;
    const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
    next.focus();
    selectView(next.id.slice(4));
  });
}

function selectView(name) {
  if (!state.session) return;
  const previous = state.view;
  state.view = name;
  for (const view of VIEWS) {
    const selected = view === name;
    $(`tab-${view}`).setAttribute("aria-selected", String(selected));
    $(`tab-${view}`).tabIndex = selected ? 0 : -1;
    $(`panel-${view}`).hidden = !selected;
  }
  if (previous !== name) viewObjects[previous].hide();
  viewObjects[name].show();
  history.replaceState(null, "", `#session=${encodeURIComponent(state.session.id)}&view=${name}`);
}

// ---- words ----

function titleOf(session) {
  return session.title || `Session ${session.id.slice(0, 8)}`;
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

if (api.token) showApp();
else showSignIn();
