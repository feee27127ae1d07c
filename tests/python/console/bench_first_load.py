#!/usr/bin/env python3
"""The console's first load on a phone's slow link (`warren bench phone`).

Opens a running gateway's console in headless Chromium (/usr/bin/chromium, through Playwright)
at a phone's size (390x844, touch), its link throttled through the DevTools protocol
(`Network.emulateNetworkConditions`: 400 ms latency, 400 kbit/s = 50,000 bytes/s each way) with
the HTTP cache off, and measures two loads, `--runs` times each:

- cold: a new browser profile, no service worker, nothing cached;
- warm: the second visit of a profile whose service worker the first visit installed (its
  cache holds the app shell), measured in a new page.

Each load reports the bytes its requests took on the wire (encoded: compressed bodies and
headers, per resource): the page's, and on the warm visit the service worker's own fetches
(a response the worker answers from its cache takes none),
first paint and first contentful paint, DOMContentLoaded, the load event, and time to
interactive, all in milliseconds from the navigation's start. Time to interactive is the first
animation frame at which the sign-in form's app key input is visible, enabled and editable:
the page's main module shows that form (`#signin` starts hidden), so it has run by then. A
probe added to every document before its own scripts polls for it with
`requestAnimationFrame` and records `performance.now()`.

Throttling applies to the page's own requests. The service worker is another DevTools target:
when one controls the page, the same conditions are set on it too (through the browser's
DevTools session), so the warm visit's network-first fetch of the page is throttled alike. The
cold visit's worker appears only as the page registers it: its install (the shell fetched into
its cache, after the page is interactive) is neither throttled nor counted.

    bench_first_load.py --url http://127.0.0.1:8080 [--runs 3] [--uncompressed-runs 1]

`--uncompressed-runs` more cold loads ask for no compression (`Accept-Encoding: identity`):
what the same load costs without it.

Prints one JSON object on stdout: {"chromium": version, "cold": [load, ...], "warm": [...],
"uncompressed": [...]}.
Every wait is bounded (Playwright's timeouts, and the caller's).
"""

import argparse
import json
import sys
import time
from urllib.parse import urlparse

from playwright.sync_api import sync_playwright

LATENCY_MS = 400
BYTES_PER_S = 50_000
PHONE = {
    "viewport": {"width": 390, "height": 844},
    "is_mobile": True,
    "has_touch": True,
    "device_scale_factor": 3,
}
TIMEOUT_MS = 60_000
CONDITIONS = {
    "offline": False,
    "latency": LATENCY_MS,
    "downloadThroughput": BYTES_PER_S,
    "uploadThroughput": BYTES_PER_S,
}

# Runs in every document before its own scripts: records when the sign-in input is first
# visible, enabled and editable, polled once per animation frame.
INTERACTIVE_PROBE = """
(() => {
  if (window.top !== window) return;
  const editable = () => {
    const form = document.getElementById("signin");
    const input = document.getElementById("app-key");
    if (!form || !input || form.hidden || input.disabled || input.readOnly) return false;
    if (input.closest("fieldset[disabled]")) return false;
    const box = input.getBoundingClientRect();
    const visible = input.checkVisibility ? input.checkVisibility({ visibilityProperty: true }) : input.offsetParent !== null;
    return visible && box.width > 0 && box.height > 0;
  };
  const poll = () => {
    if (editable()) {
      window.__warrenInteractive = performance.now();
      performance.mark("warren:bench-interactive");
      return;
    }
    requestAnimationFrame(poll);
  };
  requestAnimationFrame(poll);
})();
"""

TIMINGS = """
() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const paint = Object.fromEntries(performance.getEntriesByType("paint").map((e) => [e.name, e.startTime]));
  return {
    first_paint_ms: paint["first-paint"] ?? null,
    first_contentful_paint_ms: paint["first-contentful-paint"] ?? null,
    dom_content_loaded_ms: nav ? nav.domContentLoadedEventEnd : null,
    load_ms: nav ? nav.loadEventEnd : null,
    interactive_ms: window.__warrenInteractive ?? null,
    controlled: navigator.serviceWorker ? navigator.serviceWorker.controller !== null : false,
  };
}
"""


class Recorder:
    """Requests as the DevTools protocol reports them (the page's, and the service worker's
    own fetches): URL, whether the service worker answered, and the bytes each took on the
    wire."""

    def __init__(self):
        self.requests = {}

    def attach(self, cdp, origin="page"):
        for method in ("Network.requestWillBeSent", "Network.responseReceived", "Network.loadingFinished", "Network.loadingFailed"):
            cdp.on(method, lambda event, method=method: self.handle(origin, method, event))

    def entry(self, origin, request_id):
        return self.requests.setdefault(
            (origin, request_id), {"url": "", "origin": origin, "from_service_worker": False, "bytes": None, "encoding": "", "status": None}
        )

    def handle(self, origin, method, event):
        entry = self.entry(origin, event.get("requestId"))
        if method == "Network.requestWillBeSent":
            entry["url"] = event["request"]["url"]
        elif method == "Network.responseReceived":
            response = event["response"]
            entry["url"] = response["url"] or entry["url"]
            entry["from_service_worker"] = bool(response.get("fromServiceWorker"))
            entry["status"] = response.get("status")
            headers = {k.lower(): v for k, v in response.get("headers", {}).items()}
            entry["encoding"] = headers.get("content-encoding", "")
        elif method == "Network.loadingFinished":
            entry["bytes"] = int(event["encodedDataLength"])

    def resources(self):
        out = []
        for entry in self.requests.values():
            url = urlparse(entry["url"])
            if url.scheme not in ("http", "https"):
                continue
            out.append(
                {
                    "path": url.path + (f"?{url.query}" if url.query else ""),
                    "bytes": entry["bytes"] or 0,
                    # "page": the page's request; "worker": the service worker's own fetch.
                    "by": entry["origin"],
                    "from_service_worker": entry["from_service_worker"],
                    "encoding": entry["encoding"],
                    "status": entry["status"],
                    "finished": entry["bytes"] is not None,
                }
            )
        return out


def throttle(cdp):
    cdp.send("Network.enable")
    cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
    cdp.send("Network.emulateNetworkConditions", CONDITIONS)


def throttle_service_workers(browser_cdp, recorder):
    """Sets the link's conditions on every service worker target too (another DevTools target
    than the page; Playwright opens sessions only on pages, so this one is attached through
    the browser's session) and records its own fetches. Returns how many were throttled."""
    sessions = set()

    def from_target(event):
        if event.get("sessionId") not in sessions:
            return
        message = json.loads(event["message"])
        if message.get("method", "").startswith("Network."):
            recorder.handle("worker", message["method"], message.get("params", {}))

    browser_cdp.on("Target.receivedMessageFromTarget", from_target)
    for target in browser_cdp.send("Target.getTargets")["targetInfos"]:
        if target["type"] != "service_worker":
            continue
        session = browser_cdp.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": False})["sessionId"]
        sessions.add(session)
        commands = [
            ("Network.enable", {}),
            ("Network.setCacheDisabled", {"cacheDisabled": True}),
            ("Network.emulateNetworkConditions", CONDITIONS),
        ]
        for i, (method, params) in enumerate(commands):
            message = json.dumps({"id": 1000 + i, "method": method, "params": params})
            browser_cdp.send("Target.sendMessageToTarget", {"sessionId": session, "message": message})
    return len(sessions)


def measure(context, url, browser_cdp=None, headers=None):
    """One navigation to `url` in a new page of `context`, throttled (with `headers` on every
    request); its timings and bytes."""
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    cdp = context.new_cdp_session(page)
    recorder = Recorder()
    recorder.attach(cdp)
    throttle(cdp)
    if headers:
        cdp.send("Network.setExtraHTTPHeaders", {"headers": headers})
    n_workers = throttle_service_workers(browser_cdp, recorder) if browser_cdp else 0
    started = time.monotonic()
    page.goto(url, wait_until="load", timeout=TIMEOUT_MS)
    page.wait_for_function("window.__warrenInteractive !== undefined", timeout=TIMEOUT_MS, polling="raf")
    # Whatever the page still fetches after its load (late modules, icons) is part of the load.
    try:
        page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
    except Exception:  # noqa: BLE001 - a page that never idles is reported with what it fetched
        pass
    wall_s = time.monotonic() - started
    timings = page.evaluate(TIMINGS)
    resources = recorder.resources()
    page.close()
    return {
        **timings,
        "wall_s": wall_s,
        "bytes": sum(r["bytes"] for r in resources),
        "n_requests": sum(1 for r in resources if r["by"] == "page"),
        "n_network": sum(1 for r in resources if r["bytes"] > 0),
        "resources": sorted(resources, key=lambda r: -r["bytes"]),
        "throttled_workers": n_workers,
    }


def cold(browser, url, headers=None):
    context = browser.new_context(**PHONE, service_workers="allow")
    context.add_init_script(INTERACTIVE_PROBE)
    try:
        return measure(context, url, headers=headers)
    finally:
        context.close()


def warm(browser, url):
    context = browser.new_context(**PHONE, service_workers="allow")
    context.add_init_script(INTERACTIVE_PROBE)
    try:
        # The first visit, unthrottled: it installs the worker, which fills its cache.
        first = context.new_page()
        first.set_default_timeout(TIMEOUT_MS)
        first.goto(url, wait_until="load")
        first.evaluate("navigator.serviceWorker.ready.then(() => true)")
        first.close()
        browser_cdp = browser.new_browser_cdp_session()
        try:
            load = measure(context, url, browser_cdp)
        finally:
            browser_cdp.detach()
        if not load["controlled"]:
            raise RuntimeError("the second visit was not controlled by the service worker")
        return load
    finally:
        context.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the gateway's console, e.g. http://127.0.0.1:8080")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--uncompressed-runs", type=int, default=1, help="cold loads that refuse compression (Accept-Encoding: identity)")
    args = parser.parse_args()
    url = args.url.rstrip("/") + "/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        try:
            result = {"chromium": browser.version, "cold": [], "warm": [], "uncompressed": []}
            # Interleaved, so a slow moment of the machine falls on both kinds alike.
            for _ in range(args.runs):
                result["cold"].append(cold(browser, url))
                result["warm"].append(warm(browser, url))
            for _ in range(args.uncompressed_runs):
                result["uncompressed"].append(cold(browser, url, headers={"Accept-Encoding": "identity"}))
        finally:
            browser.close()
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
