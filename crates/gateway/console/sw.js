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
