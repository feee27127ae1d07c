// The Checkpoints view (checkpoints.md): the session's checkpoints, newest first (`GET
// /checkpoints`, a page at a time, "More" for the next), each with its turn, time, files, files
// changed and why it was taken; and per checkpoint its changes against the one before (`/diff`:
// added, removed and modified files, a modified text file as a unified diff), its files as they
// were (a read-only FilesView on the checkpoint's routes), Rewind (the workspace becomes the
// checkpoint's; asked first, saying that the current state is kept as a checkpoint) and Fork (a
// new session from it, with a title asked for). The list and a checkpoint's changes or files are
// places of the location (main.js keeps the history): opening one goes through `onNavigate`, and
// `goTo` shows what the location says. A `checkpoint` event refreshes the list while the view is
// open, and marks it stale otherwise.
//
// The pure parts (words, the list's pages, the changes as `vdom` nodes) are exported for the
// tests; paths reach the page only as text.

import { withQuery } from "./api.js";
import { confirmDialog } from "./devices.js";
import { diffLineClasses } from "./diff.js";
import { formatBytes } from "./files.js";
import { filesChangedWords } from "./render.js";
import { h, toDom } from "./vdom.js";

/** Checkpoints asked for per page. */
export const PAGE_SIZE = 20;
/** The most lines of one file's diff shown; the rest are counted. */
export const MAX_DIFF_LINES = 2000;

// ---- words ----

const REASONS = { turn: "after the turn", rewind: "before a rewind", pause: "sandbox paused", files: "your file changes", fork: "the fork's start" };

/** Why a checkpoint was taken, in words. */
export function reasonWords(reason) {
  return REASONS[reason] ?? String(reason ?? "");
}

/** A checkpoint in a sentence: "turn 3", or "before the first turn". */
export function checkpointName(checkpoint) {
  return typeof checkpoint?.turn === "number" && checkpoint.turn > 0 ? `turn ${checkpoint.turn}` : "before the first turn";
}

const capitalized = (text) => text.charAt(0).toUpperCase() + text.slice(1);

/** When a checkpoint was taken: its time today, else its day and time. */
export function timeWords(iso, now = Date.now()) {
  const then = new Date(iso ?? "");
  if (Number.isNaN(then.getTime())) return "";
  const time = then.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  if (then.toDateString() === new Date(now).toDateString()) return time;
  return `${then.toLocaleDateString([], { month: "short", day: "numeric" })}, ${time}`;
}

/** A checkpoint's sizes: "12 files, 4.1 KB · 3 changed". */
export function checkpointMeta(checkpoint) {
  const files = checkpoint.files === 1 ? "1 file" : `${checkpoint.files ?? 0} files`;
  const changed = checkpoint.files_changed ?? 0;
  // Files that changed while the checkpoint read them: stored as that read saw them.
  const under = Array.isArray(checkpoint.changed_under) ? checkpoint.changed_under : [];
  const moving = under.length === 0 ? "" : ` · ${under.length === 1 ? `${under[0]} was` : `${under.length} files were`} being written as it was taken`;
  return `${files}, ${formatBytes(checkpoint.bytes ?? 0)} · ${changed === 0 ? "nothing changed" : `${changed} changed`}${moving}`;
}

/** What the rewind's confirmation says it does. */
export function rewindParagraphs(checkpoint, now = Date.now()) {
  const when = checkpoint ? ` (${checkpointName(checkpoint)}, ${timeWords(checkpoint.created_at, now)})` : "";
  return [
    `The workspace becomes what it was at this checkpoint${when}: files changed since get their old content back, files added since are removed, files removed since come back.`,
    "The current state is kept as a checkpoint first, so you can come back to it.",
    "The conversation stays as it is; the agent is told that the workspace was rewound.",
  ];
}

// Why a checkpoint cannot be used, whatever was asked of it.
const UNUSABLE = {
  CHECKPOINT_NOT_FOUND: "This checkpoint no longer exists: old checkpoints are collected.",
  CHECKPOINT_BROKEN: "This checkpoint is damaged (a piece of it is missing or corrupt): nothing was changed.",
  STORAGE_FULL: "The gateway's storage is full: nothing was changed.",
};

/** Why a rewind failed, in words. */
export function rewindErrorWords(error) {
  if (error.code === "TURN_RUNNING") return "The agent is working on a turn: wait until it ends (or Cancel it in the Chat), then rewind.";
  return UNUSABLE[error.code] ?? `Not rewound: ${error.message}`;
}

/** Why a fork failed, in words. */
export function forkErrorWords(error) {
  if (error.code === "QUOTA_EXCEEDED") return "This device has as many sessions as it may: delete one first.";
  return UNUSABLE[error.code] ?? `Not forked: ${error.message}`;
}

/** The title a fork of `title` at `checkpoint` is offered: "Title (turn 3)". */
export function forkTitle(title, checkpoint) {
  const suffix = ` (${checkpointName(checkpoint)})`;
  return `${String(title ?? "").slice(0, 200 - suffix.length)}${suffix}`;
}

// ---- the list's pages ----

/** The list from its first page: `{items, next}` (`next`: where the next page starts, or null). */
export function firstPage(page) {
  return { items: [...(page?.checkpoints ?? [])], next: page?.next ?? null };
}

/** The list with the page that `next` named below it; a checkpoint already listed is not listed
 *  twice. */
export function withOlder(list, page) {
  const known = new Set(list.items.map((checkpoint) => checkpoint.id));
  return { items: [...list.items, ...(page.checkpoints ?? []).filter((checkpoint) => !known.has(checkpoint.id))], next: page.next ?? null };
}

/** The list with its first page asked again: the page replaces what it covers and the older ones
 *  loaded before stay below it (with their `next`); when the page reaches none of them (more
 *  were taken meanwhile than a page holds), the page alone. */
export function withNewest(list, page) {
  const items = page.checkpoints ?? [];
  if (!list || page.next === null || page.next === undefined || items.length === 0) return firstPage(page);
  const at = list.items.findIndex((checkpoint) => checkpoint.id === items.at(-1).id);
  if (at === -1) return firstPage(page);
  return { items: [...items, ...list.items.slice(at + 1)], next: list.next };
}

// ---- the changes ----

const STATUS_WORDS = { added: "Added", removed: "Removed", modified: "Modified" };

/** The files of an `added` or `removed` list, without the folders holding others there (a new
 *  folder is said by its files) or named folders (`type` "dir"). */
function withoutFolders(entries) {
  const folders = new Set();
  for (const { path } of entries) {
    for (let at = path.indexOf("/"); at !== -1; at = path.indexOf("/", at + 1)) folders.add(path.slice(0, at));
  }
  return entries.filter((entry) => entry.type !== "dir" && !folders.has(entry.path));
}

/** The changed files of a `/diff` answer, by path: `{status, path, size, kind | oldSize,
 *  newSize, binary, diff}` (`kind`: the listing's `type`, "file" when not said). */
export function diffFiles(diff) {
  const files = [
    ...withoutFolders(diff.added ?? []).map((file) => ({ status: "added", path: file.path, size: file.size, kind: file.type ?? "file" })),
    ...withoutFolders(diff.removed ?? []).map((file) => ({ status: "removed", path: file.path, size: file.size, kind: file.type ?? "file" })),
    ...(diff.modified ?? []).map((file) => ({
      status: "modified",
      path: file.path,
      oldSize: file.old_size,
      newSize: file.new_size,
      binary: Boolean(file.binary),
      diff: typeof file.diff === "string" ? file.diff : null,
    })),
  ];
  return files.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** The changes in one line: "3 files changed: 1 added, 1 modified, 1 removed". */
export function diffSummary(diff) {
  const files = diffFiles(diff);
  if (files.length === 0) return "No file changed since the checkpoint before.";
  const counts = ["added", "modified", "removed"]
    .map((status) => [status, files.filter((file) => file.status === status).length])
    .filter(([, n]) => n > 0)
    .map(([status, n]) => `${n} ${status}`);
  return `${filesChangedWords(files.length)}: ${counts.join(", ")}`;
}

/** A unified diff's lines from its first hunk on (the path is said above it). */
export function hunkLines(text) {
  const lines = text.split("\n");
  if (lines.at(-1) === "") lines.pop();
  const first = lines.findIndex((line) => line.startsWith("@@"));
  return first === -1 ? lines : lines.slice(first);
}

/** A modified file's lines added and removed: "+3 −1". */
function lineCounts(lines, classes) {
  const added = classes.filter((c) => c === "add").length;
  const removed = classes.filter((c) => c === "del").length;
  return `+${added} −${removed}`;
}

/** One changed file: its status, path and size or line counts, "View" for a file there is at the
 *  checkpoint, and a text file's diff (cut at MAX_DIFF_LINES). */
export function renderChangedFile(file) {
  let stat = "";
  let body = null;
  if (file.status !== "modified") {
    stat = file.kind === "symlink" ? "link" : formatBytes(file.size ?? 0);
  } else if (file.binary) {
    stat = `binary, ${formatBytes(file.oldSize)} → ${formatBytes(file.newSize)}`;
  } else if (file.diff === null) {
    stat = `${formatBytes(file.oldSize)} → ${formatBytes(file.newSize)}`;
    body = h("p", { class: "meta" }, "Too large to show the changes: view the file, or download it.");
  } else {
    const lines = hunkLines(file.diff);
    const classes = diffLineClasses(lines);
    stat = lineCounts(lines, classes);
    const shown = lines.slice(0, MAX_DIFF_LINES);
    body = [
      lines.length === 0
        ? h("p", { class: "meta" }, "Its text is the same (its mode or time changed).")
        : h("pre", { class: "diff", "aria-label": `Changes to ${file.path}` }, shown.map((line, n) => h("span", { class: classes[n] }, line + "\n"))),
      lines.length > shown.length ? h("p", { class: "meta" }, `${(lines.length - shown.length).toLocaleString("en-US")} more lines not shown.`) : null,
    ];
  }
  return h(
    "li",
    { class: `cp-file cp-${file.status}` },
    h(
      "div",
      { class: "cp-file-head" },
      h("p", { class: "cp-file-name" }, h("span", { class: "cp-status" }, STATUS_WORDS[file.status]), h("code", { class: "cp-path" }, file.path), h("span", { class: "cp-stat meta" }, stat)),
      file.status === "removed" || (file.kind ?? "file") !== "file" ? null : h("button", { type: "button", class: "small", "data-action": "view", "data-path": file.path, "aria-label": `View ${file.path}` }, "View"),
    ),
    body,
  );
}

/** A `/diff` answer: the summary, then each changed file by path. */
export function renderDiff(diff) {
  const files = diffFiles(diff);
  return h(
    "div",
    { class: "cp-diff" },
    h("p", { class: "cp-summary" }, diffSummary(diff)),
    files.length ? h("ul", { class: "cp-files", "aria-label": "Changed files" }, files.map(renderChangedFile)) : null,
  );
}

// ---- the list ----

/** One checkpoint of the list, with its actions (`data-action`, `data-checkpoint`) and, given
 *  `exportUrl`, a link downloading its files as a `.tar.zst`. */
export function renderCheckpoint(checkpoint, now = Date.now(), exportUrl = null) {
  const action = (name, label, cls = "") => h("button", { type: "button", class: cls, "data-action": name, "data-checkpoint": checkpoint.id }, label);
  return h(
    "li",
    { class: "checkpoint" },
    h(
      "p",
      { class: "checkpoint-head" },
      h("strong", {}, capitalized(checkpointName(checkpoint))),
      checkpoint.reason && checkpoint.reason !== "turn" ? h("span", { class: "checkpoint-reason" }, reasonWords(checkpoint.reason)) : null,
      h("span", { class: "meta checkpoint-time" }, timeWords(checkpoint.created_at, now)),
    ),
    h("p", { class: "meta" }, checkpointMeta(checkpoint)),
    h(
      "div",
      { class: "actions" },
      action("diff", "Diff"),
      action("files", "Browse files"),
      action("rewind", "Rewind", "danger"),
      action("fork", "Fork"),
      exportUrl ? h("a", { class: "button", href: exportUrl, download: "", "aria-label": `Download the files of ${checkpointName(checkpoint)}` }, "Download") : null,
    ),
  );
}

// ---- the view ----

export class CheckpointsView {
  /**
   * `elements`: panel, home (the list's part), list, more, refresh, note, error; diff (its section),
   * diffTitle, diffMeta, diffBody, diffClose; browser (the files' section), browserTitle,
   * browserClose. `files`: a read-only FilesView showing a checkpoint's files in the browser.
   * `onNavigate({checkpoint, show, dir, file})` is asked to go to a checkpoint's changes
   * (`show` "diff") or files ("files"), `{}` to the list; `onClose()` to leave them;
   * `onForked(session)` gets a new session; `sessionTitle(id)` names a session (null: unknown).
   * A rewind is said to the other views by its `rewound` event.
   */
  constructor({ elements, api, files, onNavigate, onClose, onForked, sessionTitle }) {
    this.el = elements;
    this.api = api;
    this.files = files;
    this.onNavigate = onNavigate;
    this.onForked = onForked;
    this.sessionTitle = sessionTitle;
    this.sessionId = null;
    this.list = null; // {items, next}, once loaded
    this.queue = Promise.resolve(); // loads of the list, one at a time
    this.checkpoint = null; // the checkpoint open (its changes or files), or null
    this.showing = null; // "diff", "files" or null (the list)
    this.diffFor = null; // the checkpoint whose changes are shown
    this.diffTicket = 0;
    this.homeScroll = 0; // where the list was scrolled to when a checkpoint was opened
    this.scrollTo = null; // where the panel goes once it is on screen
    this.visible = false;
    this.stale = true;

    this.el.list.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-action]");
      if (!button) return;
      const checkpoint = button.dataset.checkpoint;
      if (button.dataset.action === "diff") this.onNavigate({ checkpoint, show: "diff" });
      else if (button.dataset.action === "files") this.onNavigate({ checkpoint, show: "files" });
      else if (button.dataset.action === "rewind") this.rewind(checkpoint);
      else if (button.dataset.action === "fork") this.fork(checkpoint);
    });
    this.el.diffBody.addEventListener("click", (event) => {
      const button = event.target.closest('button[data-action="view"]');
      if (!button) return;
      const path = button.dataset.path;
      this.onNavigate({ checkpoint: this.checkpoint, show: "files", dir: path.split("/").slice(0, -1).join("/"), file: path });
    });
    this.el.more.addEventListener("click", () => this.more());
    this.el.refresh.addEventListener("click", () => this.refresh());
    this.el.diffClose.addEventListener("click", () => onClose());
    this.el.browserClose.addEventListener("click", () => onClose());
  }

  setSession(sessionId) {
    this.sessionId = sessionId;
    this.list = null;
    this.stale = true;
    this.checkpoint = null;
    this.showing = null;
    this.diffFor = null;
    this.diffTicket++;
    this.files.setSession(null);
    this.el.list.replaceChildren();
    this.el.more.hidden = true;
    this.el.diffBody.replaceChildren();
    this.say("");
    this.showError("");
    this.showPlace();
  }

  /** Shows the list, or `checkpoint`'s changes (`show` "diff") or files ("files", at `dir` and
   *  `file`). */
  goTo({ checkpoint = null, show = null, dir = "", file = null }) {
    const [wasChecking, wasShowing] = [this.checkpoint, this.showing];
    this.checkpoint = show ? checkpoint : null;
    this.showing = this.checkpoint ? show : null;
    const moved = wasChecking !== this.checkpoint || wasShowing !== this.showing;
    if (moved && wasShowing === null) this.homeScroll = this.el.panel.scrollTop;
    if (this.showing === "diff" && this.diffFor !== checkpoint) this.loadDiff(checkpoint);
    if (this.showing === "files") {
      const prefix = `/checkpoints/${encodeURIComponent(checkpoint)}`;
      if (this.files.prefix !== prefix || this.files.sessionId !== this.sessionId) this.files.setSession(this.sessionId, prefix);
      this.files.goTo({ dir, file });
    } else {
      this.files.closeFile();
    }
    this.showPlace();
    // A checkpoint's changes or files open at their top; the list comes back where it was.
    if (moved) this.scrollTo = this.showing === null ? this.homeScroll : 0;
    this.scroll();
  }

  /** Puts the panel where `goTo` wanted it, once it is on screen (a hidden one keeps its own). */
  scroll() {
    if (this.scrollTo === null || this.el.panel.clientHeight === 0) return;
    this.el.panel.scrollTop = this.scrollTo;
    this.scrollTo = null;
  }

  showPlace() {
    this.el.home.hidden = this.showing !== null;
    this.el.diff.hidden = this.showing !== "diff";
    this.el.browser.hidden = this.showing !== "files";
    const checkpoint = this.find(this.checkpoint);
    const name = checkpoint ? checkpointName(checkpoint) : "this checkpoint";
    this.el.diffTitle.textContent = `Changes in ${name}`;
    this.el.diffMeta.textContent = checkpoint ? `${timeWords(checkpoint.created_at)} · since the checkpoint before` : "Since the checkpoint before";
    this.el.browserTitle.textContent = `Files as of ${name}`;
  }

  show() {
    this.visible = true;
    this.scroll();
    if (this.stale) this.refresh();
  }

  hide() {
    this.visible = false;
  }

  /** A `checkpoint` event: a new one to list, now or when the view opens. */
  changed() {
    this.stale = true;
    if (this.visible) this.refresh();
  }

  find(id) {
    return this.list?.items.find((checkpoint) => checkpoint.id === id) ?? null;
  }

  url(route, params = {}) {
    return withQuery(`/v1/sessions/${encodeURIComponent(this.sessionId)}/checkpoints${route}`, params);
  }

  /** The newest page again, merged into the list (withNewest). */
  refresh() {
    this.stale = false;
    return this.load(null, (list, page) => withNewest(list, page));
  }

  /** The page after the list's last. */
  more() {
    if (!this.list?.next) return Promise.resolve();
    this.el.more.disabled = true;
    return this.load(this.list.next, (list, page) => withOlder(list, page)).finally(() => {
      this.el.more.disabled = false;
    });
  }

  /** Asks for the page `before` names and merges it (`merge(list, page)`), one load at a time. */
  load(before, merge) {
    this.queue = this.queue.then(async () => {
      const sessionId = this.sessionId;
      if (!sessionId) return;
      let page;
      try {
        page = await this.api.request("GET", this.url("", { before, limit: PAGE_SIZE }));
      } catch (error) {
        if (sessionId === this.sessionId) this.showError(`Could not list the checkpoints: ${error.message}`);
        return;
      }
      if (sessionId !== this.sessionId) return;
      this.showError("");
      this.list = merge(this.list, page ?? {});
      this.render();
    });
    return this.queue;
  }

  render() {
    const items = this.list?.items ?? [];
    const now = Date.now();
    const exportUrl = (checkpoint) => this.url(`/${encodeURIComponent(checkpoint.id)}/export`, { access_token: this.api.token });
    const nodes = items.map((checkpoint) => toDom(renderCheckpoint(checkpoint, now, exportUrl(checkpoint)), document));
    if (nodes.length === 0) {
      const empty = document.createElement("li");
      empty.className = "meta";
      empty.textContent = "No checkpoints yet: one is taken after each turn that uses the sandbox.";
      nodes.push(empty);
    }
    this.el.list.replaceChildren(...nodes);
    this.el.more.hidden = !this.list?.next;
    this.showPlace();
  }

  async loadDiff(checkpoint) {
    const ticket = ++this.diffTicket;
    this.diffFor = checkpoint;
    const body = this.el.diffBody;
    body.replaceChildren(Object.assign(document.createElement("p"), { className: "meta", textContent: "Loading…" }));
    body.setAttribute("aria-busy", "true");
    let diff;
    try {
      diff = await this.api.request("GET", this.url(`/${encodeURIComponent(checkpoint)}/diff`));
    } catch (error) {
      if (ticket !== this.diffTicket) return;
      this.diffFor = null;
      const why = error.code === "CHECKPOINT_NOT_FOUND" ? "This checkpoint no longer exists: old checkpoints are collected." : `Could not load the changes: ${error.message}`;
      body.replaceChildren(Object.assign(document.createElement("p"), { className: "error", textContent: why }));
      body.removeAttribute("aria-busy");
      return;
    }
    if (ticket !== this.diffTicket) return;
    body.replaceChildren(toDom(renderDiff(diff ?? {}), document));
    body.removeAttribute("aria-busy");
  }

  async rewind(id) {
    const sessionId = this.sessionId;
    const checkpoint = this.find(id);
    const rewound = await confirmDialog({
      title: `Rewind to ${checkpoint ? checkpointName(checkpoint) : "this checkpoint"}?`,
      paragraphs: rewindParagraphs(checkpoint),
      confirm: "Rewind",
      action: async () => {
        try {
          await this.api.request("POST", this.url(`/${encodeURIComponent(id)}/rewind`), { json: { restart: false } });
        } catch (error) {
          throw new Error(rewindErrorWords(error));
        }
      },
    });
    if (!rewound || sessionId !== this.sessionId) return;
    this.say(`Rewound to ${checkpoint ? checkpointName(checkpoint) : "the checkpoint"}: the workspace is as it was then. Its state before is the newest checkpoint.`);
    this.refresh();
  }

  async fork(id) {
    const checkpoint = this.find(id);
    const title = this.sessionTitle(this.sessionId) ?? "";
    let session = null;
    const forked = await confirmDialog({
      title: `Fork from ${checkpoint ? checkpointName(checkpoint) : "this checkpoint"}?`,
      paragraphs: ["A new session starts with the workspace as it was at this checkpoint. This session stays as it is."],
      confirm: "Fork",
      danger: false,
      field: { label: "Title of the new session", value: forkTitle(title, checkpoint) },
      action: async (text) => {
        try {
          session = await this.api.request("POST", this.url(`/${encodeURIComponent(id)}/fork`), { json: { title: text || forkTitle(title, checkpoint) } });
        } catch (error) {
          throw new Error(forkErrorWords(error));
        }
      },
    });
    if (forked && session) this.onForked(session);
  }

  /** A word that something was done ("" hides it). */
  say(text) {
    this.el.note.textContent = text;
    this.el.note.hidden = text === "";
  }

  showError(text) {
    this.el.error.textContent = text;
    this.el.error.hidden = text === "";
  }
}
