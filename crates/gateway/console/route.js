// Where the console is, as the location hash says it (pure, no DOM). The forms it reads:
// - `` (no hash) or `#/`: the session list;
// - `#session=<id>&view=<view>` (and, in the Files view, `&dir=<folder>&file=<path>`): a session's
//   view, a folder of its files, a file open in the viewer; in the Checkpoints view,
//   `&checkpoint=<cid>&show=diff` (its changes) or `&checkpoint=<cid>&show=files` (its files,
//   with `dir` and `file` as in the Files view); what the console writes;
// - `#/s/<id>`, `#/s/<id>/<view>`: a session's Chat, or another view (phone.md's links);
// - `#/s/<id>/checkpoints/<cid>`: a checkpoint's changes;
// - `#/s/<id>/r/<request_id>`: a session's Chat, scrolled to a permission or network request
//   (the link a push notification opens).
// Any other hash starting `#/` (`#/pair/<code>`, read by devices.js) belongs to someone else:
// `external`, which the console shows the list for and leaves in the address bar as it is.

export const VIEWS = ["chat", "terminal", "files", "preview", "network", "checkpoints"];
/** What the Checkpoints view shows of one checkpoint. */
const SHOWS = ["diff", "files"];

const decode = (part) => {
  try {
    return decodeURIComponent(part);
  } catch {
    return null;
  }
};

/** A session's place: `view` (an unknown one is the Chat) and what of it is open; a folder and
 *  a file only where the view has them (the Files view, a checkpoint's files). */
export function sessionRoute(id, view = "chat", { dir = "", file = null, checkpoint = null, show = null, requestId = null } = {}) {
  const known = VIEWS.includes(view) ? view : "chat";
  const opened = known === "checkpoints" && checkpoint && SHOWS.includes(show);
  const hasFiles = known === "files" || (opened && show === "files");
  return {
    kind: "session",
    id,
    view: known,
    dir: hasFiles ? dir : "",
    file: hasFiles ? file || null : null,
    checkpoint: opened ? checkpoint : null,
    show: opened ? show : null,
    requestId,
  };
}

/** The place `hash` names: `{kind: "list"}`, `{kind: "session", id, view, dir, file,
 *  checkpoint, show, requestId}`, `{kind: "external"}` (another module's `#/…`) or
 *  `{kind: "unknown"}`. */
export function parseRoute(hash) {
  const text = String(hash ?? "").replace(/^#/, "");
  if (text === "" || text === "/") return { kind: "list" };
  if (text.startsWith("/")) {
    const parts = text.slice(1).split("/").map(decode);
    if (parts[0] !== "s") return { kind: "external" };
    const [, id, third, fourth] = parts;
    if (!id || parts.includes(null)) return { kind: "unknown" };
    if (parts.length === 2) return sessionRoute(id);
    if (parts.length === 3 && VIEWS.includes(third)) return sessionRoute(id, third);
    if (parts.length === 4 && third === "r" && fourth) return sessionRoute(id, "chat", { requestId: fourth });
    if (parts.length === 4 && third === "checkpoints" && fourth) return sessionRoute(id, third, { checkpoint: fourth, show: "diff" });
    return { kind: "unknown" };
  }
  const params = new URLSearchParams(text);
  const id = params.get("session");
  if (!id) return { kind: "unknown" };
  const view = params.get("view") ?? "chat";
  return sessionRoute(id, view, {
    dir: params.get("dir") ?? "",
    file: params.get("file"),
    checkpoint: params.get("checkpoint"),
    show: params.get("show"),
    requestId: view === "files" || view === "checkpoints" ? null : params.get("request"),
  });
}

/** The hash the console writes for `route` ("" for the list). */
export function routeHash(route) {
  if (route.kind !== "session") return "";
  const params = new URLSearchParams({ session: route.id, view: route.view ?? "chat" });
  if (route.view === "checkpoints" && route.checkpoint) {
    params.set("checkpoint", route.checkpoint);
    params.set("show", route.show);
  }
  if (route.view === "files" || route.show === "files") {
    if (route.dir) params.set("dir", route.dir);
    if (route.file) params.set("file", route.file);
  }
  return `#${params}`;
}

/** Whether `a` and `b` are the same place (a request to scroll to aside). */
export function sameRoute(a, b) {
  return routeHash(a) === routeHash(b) && a.kind === b.kind;
}
