// The Files view: one folder of the session's workspace at a time (`GET /files?depth=1`), with
// download links (always `download`, so a browser never renders a file of the workspace as a
// page of this origin), upload by picker or drag-and-drop with progress (XMLHttpRequest, the
// one browser API that reports upload progress), new folder, rename (`POST /files/move`) and
// delete. Tapping a file's name opens it in the read-only viewer (file-viewer.js, loaded then),
// which takes the view's place until it is closed. The folder and the open file are places of
// the location (main.js keeps the history): opening either goes through `onNavigate`, and
// `goTo` shows what the location says. A `files_changed` event refreshes the folder while the
// view is open, and the open file when it is among the changed paths; file names reach the
// page only as text.
//
// The same view, `readOnly`, browses a checkpoint's files (checkpoints.js): its routes below
// `/checkpoints/<cid>` (`setSession(id, prefix)`), with the listing, the viewer and downloads
// but no upload, new folder, rename or delete.

import { withQuery } from "./api.js";

const joinPath = (dir, name) => (dir ? `${dir}/${name}` : name);

export class FilesView {
  /** `elements`: panel, list, path, up, upload, input, newFolder, progress (its box),
   *  progressBar, progressText, error, and the viewer's: viewer, viewerName, viewerNote,
   *  viewerBody, viewerWrap, viewerDownload, viewerClose (`readOnly`: none of upload to
   *  progressText). `onNavigate({dir, file})` is asked to go to a folder or a file (and then
   *  calls `goTo`); `onClose()` to close the file. */
  constructor({ elements, api, readOnly = false, onNavigate = (place) => this.goTo(place), onClose = () => this.goTo({ dir: this.dir, file: null }) }) {
    this.el = elements;
    this.api = api;
    this.readOnly = readOnly;
    this.onNavigate = onNavigate;
    this.sessionId = null;
    this.prefix = ""; // the routes' place below the session: "" (the workspace) or a checkpoint's
    this.dir = "";
    this.file = null;
    this.viewer = null; // a FileViewer, once a file was opened
    this.sizes = new Map(); // path → size of the files the folder's listing showed
    this.visible = false;
    this.stale = true;
    this.refreshTimer = null;

    this.el.up.addEventListener("click", () => this.onNavigate({ dir: this.dir.split("/").slice(0, -1).join("/"), file: null }));
    this.el.viewerClose.addEventListener("click", () => onClose());
    this.el.list.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-action]");
      if (!button) return;
      const path = button.dataset.path;
      if (button.dataset.action === "open") this.onNavigate({ dir: path, file: null });
      else if (button.dataset.action === "view") this.onNavigate({ dir: this.dir, file: path });
      else if (button.dataset.action === "rename") this.rename(path);
      else if (button.dataset.action === "delete") this.remove(path, button.dataset.type === "dir");
    });
    if (!readOnly) this.listenForUploads();
  }

  listenForUploads() {
    this.el.upload.addEventListener("click", () => this.el.input.click());
    this.el.input.addEventListener("change", () => {
      const files = [...this.el.input.files];
      this.el.input.value = "";
      this.uploadAll(files);
    });
    this.el.newFolder.addEventListener("click", () => this.newFolder());
    const panel = this.el.panel;
    panel.addEventListener("dragover", (event) => {
      if (![...(event.dataTransfer?.types ?? [])].includes("Files")) return;
      event.preventDefault();
      panel.classList.add("dropping");
    });
    panel.addEventListener("dragleave", (event) => {
      if (event.target === panel) panel.classList.remove("dropping");
    });
    panel.addEventListener("drop", (event) => {
      event.preventDefault();
      panel.classList.remove("dropping");
      this.uploadAll([...(event.dataTransfer?.files ?? [])]);
    });
  }

  /** Shows `sessionId`'s files, or (`prefix` `/checkpoints/<cid>`) a checkpoint's. */
  setSession(sessionId, prefix = "") {
    this.sessionId = sessionId;
    this.prefix = prefix;
    this.dir = "";
    this.stale = true;
    this.closeFile();
    this.el.list.replaceChildren();
    this.showError("");
  }

  /** Where the view is: its folder and the file open in the viewer (null for none). */
  place() {
    return { dir: this.dir, file: this.file };
  }

  /** Shows folder `dir` and, when `file` is a path, that file in the viewer. */
  goTo({ dir = "", file = null }) {
    if (dir !== this.dir) {
      this.dir = dir;
      this.stale = true;
    }
    if (this.stale && this.sessionId) this.refresh();
    if (file) this.openFile(file);
    else this.closeFile();
  }

  async openFile(path, { again = false } = {}) {
    if (path === this.file && !again) return;
    this.file = path;
    this.el.panel.classList.add("viewing");
    if (!this.viewer) {
      const { FileViewer } = await import("./file-viewer.js");
      this.viewer ??= new FileViewer({
        elements: {
          viewer: this.el.viewer,
          name: this.el.viewerName,
          note: this.el.viewerNote,
          body: this.el.viewerBody,
          wrap: this.el.viewerWrap,
          download: this.el.viewerDownload,
        },
        api: this.api,
      });
    }
    // Closed, or another file opened, while the viewer loaded.
    if (this.file !== path) return;
    this.viewer.open({ path, contentUrl: this.url("/files/content", { path }), downloadUrl: this.downloadUrl(path), size: this.sizes.get(path) ?? null, keepScroll: again });
  }

  closeFile() {
    this.file = null;
    this.el.panel.classList.remove("viewing");
    this.viewer?.close();
    this.el.viewer.hidden = true;
  }

  downloadUrl(path) {
    return this.url("/files/content", { path, access_token: this.api.token });
  }

  show() {
    this.visible = true;
    if (this.stale) this.refresh();
  }

  hide() {
    this.visible = false;
  }

  /** A `files_changed` event (its `paths`, `truncated`): refresh soon if the view is open, else
   *  when it opens; the open file again when it changed. */
  filesChanged(paths = [], truncated = true) {
    this.stale = true;
    if (this.visible && this.file && (truncated || paths.includes(this.file))) this.openFile(this.file, { again: true });
    if (!this.visible || this.refreshTimer !== null) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = null;
      this.refresh();
    }, 200);
  }

  open(dir) {
    this.dir = dir;
    this.refresh();
  }

  url(route, params) {
    return withQuery(`/v1/sessions/${encodeURIComponent(this.sessionId)}${this.prefix}${route}`, params);
  }

  async refresh() {
    if (!this.sessionId) return;
    const sessionId = this.sessionId;
    const prefix = this.prefix;
    const dir = this.dir;
    this.stale = false;
    let listing;
    try {
      listing = await this.api.request("GET", this.url("/files", { path: dir, depth: 1 }));
    } catch (error) {
      if (error.code === "FILE_NOT_FOUND" && dir !== "") return this.open("");
      this.showError(`Could not list the folder: ${error.message}`);
      return;
    }
    if (sessionId !== this.sessionId || prefix !== this.prefix || dir !== this.dir) return;
    this.showError("");
    this.render(listing.entries ?? []);
  }

  render(entries) {
    this.el.path.textContent = `/${this.dir}`;
    this.el.up.disabled = this.dir === "";
    // Folders first, then by name.
    const sorted = [...entries].sort((a, b) => (b.type === "dir") - (a.type === "dir") || a.name.localeCompare(b.name));
    this.sizes = new Map(entries.filter((e) => e.type === "file").map((e) => [e.path ?? joinPath(this.dir, e.name), e.size]));
    const items = sorted.map((entry) => this.entryNode(entry));
    if (items.length === 0) {
      const empty = document.createElement("li");
      empty.className = "meta";
      empty.textContent = this.readOnly ? "This folder is empty." : "This folder is empty. Upload a file or drop one here.";
      items.push(empty);
    }
    this.el.list.replaceChildren(...items);
  }

  entryNode(entry) {
    const path = entry.path ?? joinPath(this.dir, entry.name);
    const item = document.createElement("li");
    item.className = `entry entry-${entry.type}`;
    item.setAttribute("aria-label", entry.name);
    const opens = entry.type === "dir" || entry.type === "file";
    const name = document.createElement(opens ? "button" : "span");
    name.className = "name";
    name.textContent = entry.type === "dir" ? `${entry.name}/` : entry.name;
    if (opens) {
      name.type = "button";
      name.dataset.action = entry.type === "dir" ? "open" : "view";
      name.dataset.path = path;
      if (entry.type === "file") name.setAttribute("aria-label", `View ${entry.name}`);
    }
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = entry.type === "file" ? formatBytes(entry.size) : entry.type === "symlink" ? `→ ${entry.target ?? ""}` : entry.type === "dir" ? "folder" : entry.type;
    const actions = document.createElement("span");
    actions.className = "actions";
    if (entry.type === "file") {
      const download = document.createElement("a");
      download.href = this.downloadUrl(path);
      download.download = entry.name;
      download.textContent = "Download";
      download.className = "button";
      download.setAttribute("aria-label", `Download ${entry.name}`);
      actions.append(download);
    }
    for (const [action, label] of this.readOnly ? [] : [["rename", "Rename"], ["delete", "Delete"]]) {
      const button = document.createElement("button");
      button.type = "button";
      button.dataset.action = action;
      button.dataset.path = path;
      button.dataset.type = entry.type;
      button.textContent = label;
      button.setAttribute("aria-label", `${label} ${entry.name}`);
      actions.append(button);
    }
    item.append(name, meta, actions);
    return item;
  }

  async uploadAll(files) {
    for (const file of files) {
      try {
        await this.upload(file);
      } catch (error) {
        this.showError(`Upload of ${file.name} failed: ${error.message}`);
        break;
      }
    }
    this.el.progress.hidden = true;
    this.refresh();
  }

  upload(file) {
    const path = joinPath(this.dir, file.name);
    this.el.progress.hidden = false;
    this.progress(file.name, 0, file.size);
    return new Promise((resolve, reject) => {
      const request = new XMLHttpRequest();
      request.open("PUT", this.url("/files/content", { path }));
      request.setRequestHeader("Authorization", `Bearer ${this.api.token}`);
      request.upload.addEventListener("progress", (event) => this.progress(file.name, event.loaded, event.total || file.size));
      request.addEventListener("load", () => {
        if (request.status >= 200 && request.status < 300) {
          this.progress(file.name, file.size, file.size);
          resolve();
        } else {
          let message = `HTTP ${request.status}`;
          try {
            message = JSON.parse(request.responseText).message ?? message;
          } catch {
            // Not an error body of the gateway: keep the status.
          }
          reject(new Error(message));
        }
      });
      request.addEventListener("error", () => reject(new Error("the gateway did not answer")));
      request.send(file);
    });
  }

  progress(name, loaded, total) {
    const percent = total > 0 ? Math.round((loaded / total) * 100) : 100;
    this.el.progressBar.value = percent;
    this.el.progressText.textContent = `Uploading ${name}: ${percent}%`;
  }

  async newFolder() {
    const name = prompt("Name of the new folder");
    if (!name) return;
    await this.act(() => this.api.request("POST", this.url("/files/dir", { path: joinPath(this.dir, name) })), "New folder");
  }

  async rename(path) {
    const oldName = path.split("/").at(-1);
    const name = prompt(`New name for ${oldName}`, oldName);
    if (!name || name === oldName) return;
    const to = joinPath(path.split("/").slice(0, -1).join("/"), name);
    await this.act(() => this.api.request("POST", this.url("/files/move", {}), { json: { from: path, to } }), "Rename");
  }

  async remove(path, isDir) {
    const name = path.split("/").at(-1);
    if (!confirm(isDir ? `Delete the folder ${name} and everything in it?` : `Delete ${name}?`)) return;
    await this.act(() => this.api.request("DELETE", this.url("/files", { path, recursive: isDir ? "true" : undefined })), "Delete");
  }

  async act(run, what) {
    try {
      await run();
      this.showError("");
    } catch (error) {
      this.showError(`${what} failed: ${error.message}`);
    }
    this.refresh();
  }

  showError(text) {
    this.el.error.textContent = text;
    this.el.error.hidden = text === "";
  }
}

export function formatBytes(n) {
  if (typeof n !== "number") return "";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  if (n < 1024 ** 3) return `${(n / 1024 / 1024).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(1)} GB`;
}
