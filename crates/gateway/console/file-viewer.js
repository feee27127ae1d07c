// The Files view's read-only viewer: a file of the workspace (or of one of its checkpoints) shown
// as text, with line numbers, soft wrap on or off, and colours by its extension (highlight.js,
// vendored, loaded with the first file that has a language), instead of a download. Loaded by
// files.js when a file is first opened, so the console's first load does not carry it.
//
// - The content comes from `GET /files/content` with `Range: bytes=0-<VIEW_MAX_BYTES - 1>`: a
//   larger file shows its first MiB, says so, and offers the download of the whole.
// - A file with a NUL byte or bytes that are not UTF-8 is "binary": its size and a download, no
//   text.
// - Colours only up to HIGHLIGHT_MAX_BYTES of text (highlighting is one synchronous pass that
//   would hold a phone's page for seconds past that); the text is shown plain first, coloured
//   once highlight.js has read it.
// - The file's text reaches the page only as text nodes: highlight.js's HTML is read back into
//   spans by `parseHighlighted`, which knows its three shapes (`<span class="hljs-…">`,
//   `</span>`, escaped text) and gives up on anything else (the text then stays plain).
// The pure parts (the plan for some bytes, the language of a name, the lines of highlighted
// HTML) are exported for the tests.

/** The most of a file the viewer reads and shows. */
export const VIEW_MAX_BYTES = 1024 * 1024;
/** The most text that is coloured; past it the text is plain. */
export const HIGHLIGHT_MAX_BYTES = 256 * 1024;
/** Lines per block of the page: a block off screen is not laid out (`content-visibility`), so
 *  a file of 30,000 lines opens as fast as one screen of them. */
export const BLOCK_LINES = 200;

// highlight.js language names by file extension (lower case), then by whole file name.
const BY_EXTENSION = {
  js: "javascript", mjs: "javascript", cjs: "javascript", jsx: "javascript",
  ts: "typescript", tsx: "typescript", mts: "typescript", cts: "typescript",
  py: "python", pyi: "python", pyw: "python",
  rs: "rust", go: "go",
  sh: "bash", bash: "bash", zsh: "bash", ksh: "bash", "sh-session": "shell",
  json: "json", jsonc: "json", json5: "json", jsonl: "json", ndjson: "json", ipynb: "json", webmanifest: "json",
  yaml: "yaml", yml: "yaml",
  toml: "ini", ini: "ini", cfg: "ini", conf: "ini", properties: "ini", env: "ini",
  md: "markdown", markdown: "markdown",
  html: "xml", htm: "xml", xhtml: "xml", xml: "xml", svg: "xml", plist: "xml", csproj: "xml",
  css: "css",
  c: "c", h: "c",
  cc: "cpp", cpp: "cpp", cxx: "cpp", hh: "cpp", hpp: "cpp", hxx: "cpp", ino: "cpp",
  java: "java",
  diff: "diff", patch: "diff",
  sql: "sql",
  mk: "makefile", mak: "makefile",
  dockerfile: "dockerfile", containerfile: "dockerfile",
};
const BY_NAME = {
  dockerfile: "dockerfile", containerfile: "dockerfile",
  makefile: "makefile", gnumakefile: "makefile",
  ".bashrc": "bash", ".bash_profile": "bash", ".profile": "bash", ".zshrc": "bash", ".envrc": "bash",
  ".gitconfig": "ini", ".editorconfig": "ini", ".npmrc": "ini", "cargo.lock": "ini", "pipfile": "ini",
  ".env": "ini",
};

/** The languages vendored under vendor/highlight/languages/ (each `<name>.min.js`). */
export const LANGUAGES = [...new Set([...Object.values(BY_EXTENSION), ...Object.values(BY_NAME)])].sort();

/** The highlight.js language of a file name, or null (plain text). */
export function languageOf(name) {
  const base = String(name ?? "").split("/").at(-1).toLowerCase();
  if (BY_NAME[base]) return BY_NAME[base];
  if (base.startsWith("dockerfile.") || base.endsWith(".dockerfile")) return "dockerfile";
  const dot = base.lastIndexOf(".");
  return dot === -1 ? null : (BY_EXTENSION[base.slice(dot + 1)] ?? null);
}

/** The text of `bytes` (UTF-8), or null when they are binary (a NUL byte, or not UTF-8).
 *  `cut`: the bytes are the start of a longer file, so a character cut at their end is not an
 *  error (it is left out). */
export function decodeText(bytes, { cut = false } = {}) {
  if (bytes.includes(0)) return null;
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes, { stream: cut });
  } catch {
    return null;
  }
}

/** What the viewer shows for the first `bytes` of a file of `totalBytes` named `name`:
 *  `{kind: "empty"}`, `{kind: "binary", totalBytes}` or `{kind: "text", text, truncated,
 *  totalBytes, shownBytes, language, highlight}`. */
export function viewerPlan({ name, bytes, totalBytes }) {
  const total = Math.max(totalBytes ?? bytes.length, bytes.length);
  if (total === 0) return { kind: "empty" };
  const shown = bytes.length > VIEW_MAX_BYTES ? bytes.subarray(0, VIEW_MAX_BYTES) : bytes;
  const truncated = shown.length < total;
  const text = decodeText(shown, { cut: truncated });
  if (text === null) return { kind: "binary", totalBytes: total };
  const language = languageOf(name);
  return {
    kind: "text",
    text,
    truncated,
    totalBytes: total,
    shownBytes: shown.length,
    language,
    highlight: language !== null && shown.length <= HIGHLIGHT_MAX_BYTES,
  };
}

/** A size in words: "812 bytes", "1.5 KiB", "3.2 MiB". */
export function sizeWords(n) {
  if (n < 1024) return n === 1 ? "1 byte" : `${n.toLocaleString("en-US")} bytes`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  if (n < 1024 ** 3) return `${(n / 1024 / 1024).toFixed(1)} MiB`;
  return `${(n / 1024 ** 3).toFixed(1)} GiB`;
}

/** The note above the content, or "" for none. */
export function planNote(plan) {
  if (plan.kind === "empty") return "Empty file.";
  if (plan.kind === "binary") return `Binary file, ${plan.totalBytes.toLocaleString("en-US")} bytes: download it to open it.`;
  if (plan.truncated) return `Showing the first ${sizeWords(plan.shownBytes)} of ${sizeWords(plan.totalBytes)}: download it for the rest.`;
  if (plan.language && !plan.highlight) return `No colours past ${sizeWords(HIGHLIGHT_MAX_BYTES)}.`;
  return "";
}

/** The lines of `text` (`\n` or `\r\n`; a final newline ends the last line, it starts none). */
export function textLines(text) {
  const lines = text.split("\n").map((line) => (line.endsWith("\r") ? line.slice(0, -1) : line));
  if (lines.length > 1 && lines.at(-1) === "") lines.pop();
  return lines;
}

const ENTITIES = { amp: "&", lt: "<", gt: ">", quot: '"', "#x27": "'", "#39": "'" };

/**
 * highlight.js's HTML as tokens: `{open: ["hljs-title", "function_"]}`, `{close: true}`,
 * `{text}` (entities decoded); null when it holds anything else (then nothing is trusted).
 */
export function parseHighlighted(html) {
  const tokens = [];
  const pattern = /<span class="([A-Za-z0-9_ -]*)">|<\/span>|([^<&]+)|&(amp|lt|gt|quot|#x27|#39);/gy;
  let depth = 0;
  let at = 0;
  while (at < html.length) {
    pattern.lastIndex = at;
    const found = pattern.exec(html);
    if (!found) return null;
    at = pattern.lastIndex;
    if (found[1] !== undefined) {
      tokens.push({ open: found[1].split(" ").filter(Boolean) });
      depth++;
    } else if (found[0] === "</span>") {
      if (depth-- === 0) return null;
      tokens.push({ close: true });
    } else {
      const text = found[2] ?? ENTITIES[found[3]];
      const last = tokens.at(-1);
      if (last?.text !== undefined) last.text += text;
      else tokens.push({ text });
    }
  }
  return depth === 0 ? tokens : null;
}

/**
 * The lines of highlighted HTML, each a list of nodes: a string, or `{classes, children}` for a
 * span. A span across a line break is closed at the end of its line and opened again on the
 * next, so each line stands alone. null when the HTML is not highlight.js's (see above).
 */
export function highlightedLines(html) {
  const tokens = parseHighlighted(html);
  if (!tokens) return null;
  const lines = [];
  let stack = []; // the open spans, outermost first: {classes, children}
  let line = [];
  const target = () => (stack.length ? stack.at(-1).children : line);
  const newLine = () => {
    lines.push(line);
    line = [];
    // The spans still open go on in the new line.
    const reopened = [];
    for (const span of stack) {
      const copy = { classes: span.classes, children: [] };
      (reopened.length ? reopened.at(-1).children : line).push(copy);
      reopened.push(copy);
    }
    stack = reopened;
  };
  for (const token of tokens) {
    if (token.open) {
      const span = { classes: token.open, children: [] };
      target().push(span);
      stack.push(span);
    } else if (token.close) {
      stack.pop();
    } else {
      token.text.split("\n").forEach((piece, n) => {
        if (n > 0) newLine();
        const clean = piece.endsWith("\r") ? piece.slice(0, -1) : piece;
        if (clean !== "") target().push(clean);
      });
    }
  }
  lines.push(line);
  // As textLines: a final newline ends the last line.
  if (lines.length > 1 && isBlank(lines.at(-1))) lines.pop();
  return lines;
}

const isBlank = (nodes) => nodes.every((node) => typeof node !== "string" && isBlank(node.children));

// ---- highlight.js, loaded on first use ----

let core = null;

/** highlight.js with `language` registered (loading both on first use). */
export async function highlighter(language) {
  core ??= import("./vendor/highlight/core.min.js").then((module) => module.default);
  const hljs = await core;
  if (!hljs.getLanguage(language)) {
    if (!LANGUAGES.includes(language)) throw new Error(`no language ${language}`);
    const grammar = await import(`./vendor/highlight/languages/${language}.min.js`);
    hljs.registerLanguage(language, grammar.default);
  }
  return hljs;
}

// ---- the viewer ----

const nextFrame = () => new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));

export class FileViewer {
  /** `elements`: viewer (its section), name, note, body, wrap, download; `api` (with `token`). */
  constructor({ elements, api }) {
    this.el = elements;
    this.api = api;
    this.ticket = 0;
    this.path = null;
    this.el.wrap.addEventListener("click", () => this.setWrap(this.el.wrap.getAttribute("aria-pressed") !== "true"));
    this.setWrap(localStorage.getItem("warren.viewer.wrap") === "true");
  }

  setWrap(on) {
    this.el.wrap.setAttribute("aria-pressed", String(on));
    this.el.body.classList.toggle("wrap", on);
    localStorage.setItem("warren.viewer.wrap", String(on));
  }

  /** Shows the file at `path`, read from `contentUrl` (the live or a checkpoint's content route,
   *  without the token); `downloadUrl` is its download link; `size`, when the listing said it.
   *  `keepScroll`: the same file read again (it changed), shown where it was scrolled to. */
  async open({ path, contentUrl, downloadUrl, size = null, keepScroll = false }) {
    const ticket = ++this.ticket;
    const name = path.split("/").at(-1);
    this.path = path;
    this.el.viewer.hidden = false;
    // The name (the folder is the one the viewer was opened from); the whole path as its title.
    this.el.name.textContent = name;
    this.el.name.title = path;
    this.el.download.href = downloadUrl;
    this.el.download.download = name;
    this.el.download.setAttribute("aria-label", `Download ${name}`);
    const scrolled = keepScroll ? [this.el.body.scrollTop, this.el.body.scrollLeft] : [0, 0];
    if (!keepScroll) {
      this.el.viewer.dataset.kind = "loading";
      this.el.body.replaceChildren();
      this.note("Loading…");
    }
    this.el.body.setAttribute("aria-busy", "true");
    let plan;
    try {
      plan = viewerPlan({ name, ...(await this.read(contentUrl, size)) });
    } catch (error) {
      if (ticket === this.ticket) {
        this.el.viewer.dataset.kind = "error";
        this.note(`Could not read the file: ${error.message}`, true);
        this.el.body.removeAttribute("aria-busy");
      }
      return;
    }
    if (ticket !== this.ticket) return;
    this.el.viewer.dataset.kind = plan.kind;
    this.note(planNote(plan));
    if (plan.kind === "text") {
      // The same file again (it changed) goes from colours to colours, no plain text between.
      if (!(keepScroll && plan.highlight)) this.render(plainLines(plan.text), plan.language);
      [this.el.body.scrollTop, this.el.body.scrollLeft] = scrolled;
      if (plan.highlight) await this.highlight(plan, ticket);
      if (keepScroll && ticket === this.ticket) [this.el.body.scrollTop, this.el.body.scrollLeft] = scrolled;
    } else {
      this.el.body.replaceChildren();
    }
    if (ticket === this.ticket) this.el.body.removeAttribute("aria-busy");
  }

  close() {
    this.ticket++;
    this.path = null;
    this.el.viewer.hidden = true;
    this.el.body.replaceChildren();
  }

  /** The first VIEW_MAX_BYTES of the file at `url` and its whole size (`size`: what the listing
   *  said). */
  async read(url, size) {
    const headers = { Authorization: `Bearer ${this.api.token}` };
    // An empty file has no byte 0 to start a range at (416): one listed empty is asked whole.
    if (size !== 0) headers.Range = `bytes=0-${VIEW_MAX_BYTES - 1}`;
    const response = await fetch(url, { headers });
    if (response.status === 416) return { bytes: new Uint8Array(0), totalBytes: 0 };
    if (!response.ok) {
      let message = `HTTP ${response.status}`;
      try {
        message = (await response.json()).message ?? message;
      } catch {
        // Not the gateway's error shape: the status says enough.
      }
      throw new Error(message);
    }
    const range = /\/(\d+)\s*$/.exec(response.headers.get("Content-Range") ?? "");
    const length = Number(response.headers.get("Content-Length") ?? NaN);
    const bytes = await readAtMost(response, VIEW_MAX_BYTES + 1);
    return { bytes, totalBytes: range ? Number(range[1]) : Number.isFinite(length) ? length : bytes.length };
  }

  async highlight(plan, ticket) {
    // The plain text is on screen first; colours come after a frame.
    await nextFrame();
    let lines = null;
    try {
      const hljs = await highlighter(plan.language);
      if (ticket !== this.ticket) return;
      lines = highlightedLines(hljs.highlight(plan.text, { language: plan.language, ignoreIllegals: true }).value);
    } catch (error) {
      console.warn("no colours for this file:", error);
    }
    if (lines && ticket === this.ticket) this.render(lines, plan.language, true);
  }

  /** Puts `lines` (see highlightedLines) on the page, numbered. */
  render(lines, language, coloured = false) {
    const doc = this.el.body.ownerDocument;
    const pre = doc.createElement("pre");
    pre.className = coloured ? "code hljs" : "code";
    if (language) pre.dataset.language = language;
    pre.style.setProperty("--gutter", `${String(lines.length).length}ch`);
    const code = doc.createElement("code");
    let block = null;
    lines.forEach((nodes, n) => {
      if (n % BLOCK_LINES === 0) {
        block = doc.createElement("span");
        block.className = "code-block";
        block.style.setProperty("--block-lines", String(Math.min(BLOCK_LINES, lines.length - n)));
        code.append(block);
      }
      const line = doc.createElement("span");
      line.className = "code-line";
      line.dataset.line = String(n + 1);
      for (const node of nodes) line.append(toNode(node, doc));
      block.append(line);
    });
    pre.append(code);
    this.el.body.replaceChildren(pre);
  }

  note(text, error = false) {
    this.el.note.textContent = text;
    this.el.note.hidden = text === "";
    this.el.note.classList.toggle("error", error);
  }
}

/** The first `max` bytes of a response's body (the rest is not downloaded). */
async function readAtMost(response, max) {
  if (!response.body) return new Uint8Array(await response.arrayBuffer()).subarray(0, max);
  const reader = response.body.getReader();
  const chunks = [];
  let n = 0;
  while (n < max) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    n += value.length;
  }
  if (n >= max) reader.cancel().catch(() => {});
  const bytes = new Uint8Array(Math.min(n, max));
  let at = 0;
  for (const chunk of chunks) {
    const part = chunk.subarray(0, bytes.length - at);
    bytes.set(part, at);
    at += part.length;
  }
  return bytes;
}

/** Plain text as lines of one string each. */
function plainLines(text) {
  return textLines(text).map((line) => (line === "" ? [] : [line]));
}

function toNode(node, doc) {
  if (typeof node === "string") return doc.createTextNode(node);
  const span = doc.createElement("span");
  span.className = node.classes.join(" ");
  for (const child of node.children) span.append(toNode(child, doc));
  return span;
}
