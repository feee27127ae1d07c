#!/usr/bin/env python3
"""Browser tests of the web console (spec/console.md, "Proven in a real browser").

Drives a running `warren serve` with headless Chromium (/usr/bin/chromium) through Playwright,
at a phone size (390x844, touch) and a desktop size (1280x800). Each flow of the spec is one
function; they run in order on one page per size (sign in, create a session, chat, permission,
cancel, agent text as text, terminal, reload, takeover, the agent's terminal, files,
checkpoints, preview, reconnect, token sign-in, delete). Throughout, the run fails on a console error or page error
of the console, a request to an origin other than the gateway's or a preview's, a horizontal
scroll on the phone, or a dialog nobody asked for (an `alert` from agent text).

    run.py --url http://127.0.0.1:8080 --app-key wk_... --shots DIR [--measure]

Prints one line per flow (`ok` / `FAIL`), writes screenshots of each view at both sizes into
DIR, and exits 0 only when every flow passed. `--measure` adds the measurements: the console's
first load in compressed bytes, the time to render a session of 2,000 events, and the
terminal's keystroke-to-echo time.
"""

import argparse
import faulthandler
import gc
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from playwright.sync_api import expect, sync_playwright

sys.path.insert(0, str(Path(__file__).parent))
from flows_checkpoints import CheckpointFlows  # noqa: E402
from flows_devices import DeviceFlows  # noqa: E402
from flows_phone_layout import LayoutFlows  # noqa: E402

SIZES = {
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True},
    "desktop": {"viewport": {"width": 1280, "height": 800}},
}
TIMEOUT_MS = 20_000
# How long one flow (or the start, or the end) may take before the run is ended: Playwright's
# waits are bounded by TIMEOUT_MS, but a few calls (a page's `evaluate` behind an open dialog, a
# download's `path`) wait without a bound.
FLOW_LIMIT_S = 240

# Browser-made console errors for failures a flow causes on purpose: the network going away,
# a holder attach refused because another page holds the terminal (409), an SSE stream cut.
EXPECTED_NETWORK_ERRORS = re.compile(
    r"ERR_INTERNET_DISCONNECTED|ERR_NETWORK_CHANGED|ERR_CONNECTION_REFUSED|ERR_NETWORK_IO_SUSPENDED"
    r"|WebSocket connection to .* failed|net::ERR_FAILED"
)
FLOWS_WITH_NETWORK_ERRORS = {"terminal_reload", "terminal_takeover", "reconnect_no_duplicate", "agent_terminal_watch"}
# A flow's own bad input, which the browser logs as a failed load: the Network view's refused rule.
EXPECTED_BAD_REQUESTS = {"network_request_and_view": re.compile(r"status of 400 \(Bad Request\) \(.*/egress\)")}


class Watchdog:
    """Ends the run when one step takes longer than FLOW_LIMIT_S: it prints the step, where
    every thread and every suspended greenlet (Playwright's sync API runs the flows in one) was,
    and exits with status 3, so a hang is a failure that says where it hung."""

    def __init__(self):
        self.timer = None

    def arm(self, step):
        self.disarm()
        self.timer = threading.Timer(FLOW_LIMIT_S, self.fire, args=(step,))
        self.timer.daemon = True
        self.timer.start()

    def disarm(self):
        if self.timer:
            self.timer.cancel()
            self.timer = None

    @staticmethod
    def fire(step):
        print(f"FAIL {step}: still running after {FLOW_LIMIT_S} s; where it was:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for thing in gc.get_objects():
            frame = getattr(thing, "gr_frame", None) if type(thing).__name__ == "greenlet" else None
            if frame is not None:
                print("greenlet:", file=sys.stderr)
                traceback.print_stack(frame, file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)


WATCHDOG = Watchdog()


class Gateway:
    """The gateway's API, called from the test itself (not from the page)."""

    def __init__(self, url, token=None):
        self.url = url.rstrip("/")
        self.token = token

    def call(self, method, path, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
                return response.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as error:
            text = error.read().decode()
            return error.code, (json.loads(text) if text.startswith("{") else text)

    def message(self, session_id, text):
        status, body = self.call("POST", f"/v1/sessions/{session_id}/messages", {"text": text})
        assert status == 202, f"message not taken: {status} {body}"

    def wait_idle(self, session_id, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, session = self.call("GET", f"/v1/sessions/{session_id}")
            assert status == 200, f"session {session_id}: {status} {session}"
            if session["status"] == "idle":
                return session
            time.sleep(0.2)
        raise AssertionError(f"session {session_id} still running after {timeout_s} s")


class Run(LayoutFlows, DeviceFlows, CheckpointFlows):
    """One size's page, what it saw, and the flows' results."""

    def __init__(self, args, browser, size):
        self.args = args
        self.browser = browser
        self.size = size
        self.shots = Path(args.shots)
        self.origin = args.url.rstrip("/")
        WATCHDOG.arm(f"{size} setup")
        self.context = browser.new_context(**SIZES[size])
        self.context.set_default_timeout(TIMEOUT_MS)
        self.flow = "setup"
        self.problems = []
        self.dialog_answers = []
        self.page = self.watch(self.context.new_page())
        self.session_id = None
        self.title = f"{size} console test"
        self.n_user_messages = 0
        self.failed = False

    # ---- what every page is watched for ----

    def watch(self, page):
        page.on("console", self.on_console)
        page.on("pageerror", lambda error: self.problems.append(f"[{self.flow}] page error: {error}"))
        page.on("request", self.on_request)
        page.on("dialog", self.on_dialog)
        return page

    def on_console(self, message):
        if message.type != "error":
            return
        where = message.location.get("url", "") if message.location else ""
        if re.match(r"https?://p-[a-z0-9]+\.localhost", where):
            return  # the previewed app's own page (python's http.server has no favicon)
        if self.flow in FLOWS_WITH_NETWORK_ERRORS and EXPECTED_NETWORK_ERRORS.search(message.text):
            return
        if self.flow == "preview_http_server" and "502" in message.text:
            return  # the preview opened before the server listened
        expected = EXPECTED_BAD_REQUESTS.get(self.flow)
        if expected and expected.search(f"{message.text} ({where})"):
            return
        self.problems.append(f"[{self.flow}] console error: {message.text} ({where})")

    def on_request(self, request):
        url = request.url
        if url.startswith("data:"):
            return
        parsed = urlparse(url)
        origin = f"{parsed.scheme}://{parsed.netloc}"
        gateway = urlparse(self.origin)
        same = parsed.netloc == gateway.netloc and parsed.scheme in ("http", "ws")
        preview = re.fullmatch(r"p-[a-z0-9]+\.localhost(:\d+)?", parsed.netloc) and parsed.port == gateway.port
        if not same and not preview:
            self.problems.append(f"[{self.flow}] request to another origin: {origin} ({url})")

    def on_dialog(self, dialog):
        # A dialog is always answered: one left open would keep every later call into the page
        # (`evaluate`, which Playwright does not time out) waiting.
        if self.dialog_answers:
            kind, answer = self.dialog_answers.pop(0)
            if dialog.type != kind:
                self.problems.append(f"[{self.flow}] expected a {kind}, got a {dialog.type}: {dialog.message}")
                dialog.dismiss()
            elif answer is None:
                dialog.dismiss()
            elif kind == "prompt":
                dialog.accept(answer)
            else:
                dialog.accept()
        else:
            self.problems.append(f"[{self.flow}] unexpected {dialog.type}: {dialog.message}")
            dialog.dismiss()

    def answer_next_dialog(self, kind, answer=""):
        self.dialog_answers.append((kind, answer))

    # ---- helpers ----

    def shot(self, view):
        self.page.screenshot(path=str(self.shots / f"{self.size}-{view}.png"))

    def no_horizontal_scroll(self):
        if self.size != "phone":
            return
        width = self.page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"the page scrolls sideways: scrollWidth {width[0]} > innerWidth {width[1]}"

    def tap_targets(self):
        """On the phone every visible control is at least 40 px each way (links inside text and
        xterm.js's off-screen input aside)."""
        if self.size != "phone":
            return
        small = self.page.evaluate(
            """() => [...document.querySelectorAll('button, a[href], input:not([type=file]), textarea, select, summary, [role=tab]')]
                .filter((e) => e.offsetParent !== null && !e.closest('.log p, .log li') && !e.classList.contains('xterm-helper-textarea'))
                .map((e) => [e.getAttribute('aria-label') || e.textContent.trim(), e.getBoundingClientRect()])
                .filter(([, r]) => r.width > 0 && (r.width < 40 || r.height < 40))
                .map(([name, r]) => `${name} ${Math.round(r.width)}x${Math.round(r.height)}`)"""
        )
        assert not small, f"tap targets under 40 px: {small}"

    def role(self, role, name, **kw):
        return self.page.get_by_role(role, name=name, exact=True, **kw)

    @property
    def log(self):
        return self.role("log", "Conversation")

    def send(self, text):
        box = self.role("textbox", "Message")
        box.fill(text)
        box.press("Enter")
        self.n_user_messages += 1
        expect(box).to_have_value("")

    def tool(self, title):
        return self.log.locator(".tool").filter(has=self.page.locator("code.tool-title", has_text=title))

    def wait_tool_done(self, title):
        expect(self.tool(title).last).to_have_class(re.compile(r"tool-(completed|failed)"))

    def agent_text(self, text):
        return self.log.locator(".msg.agent").filter(has_text=re.compile("^" + re.escape(text) + "$"))

    def api(self):
        token = self.page.evaluate("localStorage.getItem('warren.token')")
        return Gateway(self.origin, token)

    def tab(self, name):
        self.role("tab", name).click()
        expect(self.role("tab", name)).to_have_attribute("aria-selected", "true")

    def terminal_rows(self, page=None):
        return (page or self.page).get_by_role("region", name="Terminal", exact=True).locator(".xterm-rows")

    def terminal_status(self, page=None):
        return (page or self.page).get_by_role("status", name="Terminal status", exact=True)

    # ---- flows ----

    def sign_in_register(self):
        page = self.page
        page.goto(self.origin + "/")
        for role, name in [("textbox", "App key"), ("textbox", "Device name"), ("button", "Register"), ("textbox", "Device token"), ("button", "Sign in")]:
            expect(self.role(role, name)).to_be_visible()
        suggested = self.role("textbox", "Device name").input_value()
        assert re.fullmatch(r"[A-Za-z0-9_-]{8,128}", suggested), f"suggested device name {suggested!r}"
        self.no_horizontal_scroll()
        self.tap_targets()
        self.shot("signin")
        self.role("textbox", "App key").fill(self.args.app_key)
        self.role("button", "Register").click()
        expect(self.role("list", "Sessions")).to_be_visible()
        expect(self.role("button", "Sign out")).to_be_visible()
        assert page.evaluate("localStorage.getItem('warren.token')").startswith("wr_")

    def create_session(self):
        self.role("textbox", "Session title").fill(self.title)
        self.role("button", "New session").click()
        expect(self.page.get_by_role("heading", name=self.title, exact=True)).to_be_visible()
        for name in ["Chat", "Terminal", "Files", "Preview", "Network"]:
            expect(self.role("tab", name)).to_be_visible()
        expect(self.log).to_be_visible()
        expect(self.role("status", "Connection")).to_have_text("connected")
        expect(self.page.locator("#session-state")).to_contain_text("agent")
        self.session_id = re.search(r"session=([^&]+)", self.page.url).group(1)
        if self.size == "phone":
            expect(self.role("list", "Sessions")).to_be_hidden()
            self.role("button", "Sessions").click()
            expect(self.role("list", "Sessions")).to_be_visible()
            self.no_horizontal_scroll()
            self.tap_targets()
            self.shot("sessions")
            self.role("list", "Sessions").get_by_role("button", name=self.title, exact=True).click()
            expect(self.log).to_be_visible()
        else:
            expect(self.role("list", "Sessions").get_by_role("button", name=self.title, exact=True)).to_be_visible()
            self.shot("sessions")

    def echo_hi(self):
        self.send("echo hi")
        expect(self.agent_text("hi")).to_have_count(1)
        expect(self.log.locator(".msg.user").last).to_have_text("echo hi")
        self.wait_tool_done("echo hi")

    def shift_enter_is_a_newline(self):
        box = self.role("textbox", "Message")
        box.fill("")
        box.type("echo one")
        box.press("Shift+Enter")
        box.type("echo two")
        assert box.input_value() == "echo one\necho two", repr(box.input_value())
        box.press("Enter")
        self.n_user_messages += 1
        # The agent's two lines, one line break between them (a <br>, no text of its own).
        expect(self.log.locator(".msg.agent").filter(has_text=re.compile(r"^one\s*two$"))).to_have_count(1)
        expect(self.log.locator(".msg.agent").last.locator("br")).to_have_count(1)
        self.wait_tool_done("echo one")

    def permission_rm(self):
        self.send("touch doomed.txt")
        self.wait_tool_done("touch doomed.txt")
        self.send("rm doomed.txt")
        group = self.page.get_by_role("group", name="Permission request", exact=True).last
        expect(group).to_be_visible()
        expect(group).to_contain_text("rm doomed.txt")
        expect(group.get_by_role("button", name="Run it", exact=True)).to_be_visible()
        expect(group.get_by_role("button", name="Don't run it", exact=True)).to_be_visible()
        self.no_horizontal_scroll()
        self.shot("permission")
        group.get_by_role("button", name="Run it", exact=True).click()
        expect(group).to_contain_text("Answered: Run it")
        expect(group.get_by_role("button")).to_have_count(0)
        self.wait_tool_done("rm doomed.txt")
        expect(self.tool("rm doomed.txt").last).to_have_class(re.compile("tool-completed"))
        status, listing = self.api().call("GET", f"/v1/sessions/{self.session_id}/files?path=&depth=1")
        assert status == 200 and all(e["name"] != "doomed.txt" for e in listing["entries"]), listing

    def cancel_turn(self):
        cancel = self.role("button", "Cancel")
        self.send("sleep 30")
        expect(cancel).to_be_enabled()
        n_cancelled = self.log.locator(".note.cancelled").count()
        cancel.click()
        expect(self.log.locator(".note.cancelled")).to_have_count(n_cancelled + 1)
        expect(self.log.locator(".note.cancelled").last).to_have_text("cancelled")
        expect(cancel).to_be_disabled()

    def agent_html_is_text(self):
        self.send("printf '<img src=x onerror=alert(1)>'")
        expect(self.agent_text("<img src=x onerror=alert(1)>")).to_have_count(1)
        self.send("printf '[ok](https://example.com/) [bad](javascript:alert(2)) <b>bold</b>'")
        # Command output is terminal text: shown as typed, no link made (links in the agent's
        # prose are Markdown, made safe: the node tests of markdown.js).
        message = self.agent_text("[ok](https://example.com/) [bad](javascript:alert(2)) <b>bold</b>")
        expect(message).to_have_count(1)
        expect(message.get_by_role("link")).to_have_count(0)
        assert self.log.locator("img, b, script, iframe").count() == 0, "agent text made an element"
        self.wait_tool_done("printf '[ok]")
        self.no_horizontal_scroll()
        self.shot("chat")

    def shell_output_is_terminal_text(self):
        """A command's output is terminal text, never Markdown: monospace, as typed (`a*b*c`,
        `# x`), ANSI colours as classes (no inline style); a long one is folded to its last lines
        with "Show all N lines" (and back), and every output has a Copy button."""
        page = self.page
        self.tab("Chat")
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=self.origin)
        log_height = lambda: self.log.evaluate("log => log.scrollHeight")  # noqa: E731
        before = log_height()
        self.send("printf 'a*b*c\\n# x\\n\\033[31mred\\033[0m plain\\n'; seq 1 5000")
        self.wait_tool_done("printf 'a*b*c")
        block = self.log.locator(".command-output").filter(has=page.locator("pre.term-text", has_text="a*b*c")).last
        pre = block.locator("pre.term-text")
        expect(pre).to_contain_text("5000")
        # What the pre shows, folded lines included: its text with a newline per <br>.
        lines = pre.evaluate(
            """pre => { let t = ''; const walk = (n) => { for (const c of n.childNodes) {
                   if (c.nodeType === 3) t += c.data; else if (c.tagName === 'BR') t += '\\n'; else walk(c); } };
                 walk(pre); return t.split('\\n'); }"""
        )
        assert lines[:4] == ["a*b*c", "# x", "red plain", "1"] and lines[-1] == "5000" and len(lines) == 5003, lines[:5]
        style = pre.evaluate("pre => [getComputedStyle(pre).fontFamily, getComputedStyle(pre).whiteSpace]")
        assert "monospace" in style[0] and style[1] == "pre", style
        assert block.locator("h3, h4, em, strong, a, ul, [style]").count() == 0, "command output went through Markdown"
        red = pre.locator("span.ansi-red")
        expect(red).to_have_text("red")
        colours = red.evaluate("span => [getComputedStyle(span).color, getComputedStyle(span.parentElement).color]")
        assert colours[0] != colours[1], f"red is not a colour of its own: {colours}"
        # Folded: the last 20 lines on screen, the rest behind "Show all".
        expect(block).to_have_class(re.compile(r"\boutput-folded\b"))
        show_all = block.get_by_role("button", name="Show all 5,003 lines", exact=True).first
        expect(show_all).to_be_visible()
        expect(pre.locator(".term-text-head")).to_be_hidden()
        shown = pre.evaluate("pre => pre.innerText")
        assert shown.rstrip().endswith("4999\n5000") and "4981\n4982" in shown and "4980" not in shown and "a*b*c" not in shown, shown[:200]
        grown = log_height() - before
        height = page.evaluate("document.scrollingElement.scrollHeight")
        assert grown < 1500 and height < 5000, f"the output made the log {grown} px taller, the page {height} px tall"
        self.no_horizontal_scroll()
        self.tap_targets()
        # The command's card, the bar (Show all, Copy) and the tail, from the top of the log.
        block.evaluate("b => (b.previousElementSibling || b).scrollIntoView({block: 'start'})")
        self.shot("terminal-output")
        # Show all, then fold again.
        show_all.click()
        expect(block).to_have_class(re.compile(r"\boutput-open\b"))
        expect(pre.locator(".term-text-head")).to_be_visible()
        assert "a*b*c" in pre.evaluate("pre => pre.innerText")
        assert log_height() - before > 5000 * 10, "Show all did not show the 5,003 lines"
        fold = block.get_by_role("button", name="Show last 20 lines", exact=True)
        expect(fold).to_have_count(2)
        fold.last.click()
        expect(block).to_have_class(re.compile(r"\boutput-folded\b"))
        expect(pre.locator(".term-text-head")).to_be_hidden()
        assert log_height() - before < 1500
        # Copy: the plain text, folded lines included, on the clipboard; the button says so.
        copy = block.get_by_role("button", name="Copy", exact=True)
        copy.click()
        expect(block.get_by_role("button", name="Copied", exact=True)).to_be_visible()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied == "\n".join(lines), f"copied {len(copied)} characters: {copied[:80]!r}"
        expect(copy).to_have_text("Copy", timeout=5000)
        # A short output has Copy too, and no fold; styles and colours (256 and true colour as
        # the nearest of the 16), columns kept.
        self.send(
            "printf '\\033[1;32mPASS\\033[0m src/a*b*c.rs\\n\\033[1;31mFAIL\\033[0m \\033[4mtests/x.rs\\033[0m\\n"
            "\\033[2mdim\\033[0m \\033[3mitalic\\033[0m \\033[7minverse\\033[0m \\033[38;5;208m256\\033[0m \\033[38;2;80;160;255mrgb\\033[0m\\n'; "
            "printf '%-8s%-8s%s\\n' name size kind a.txt 12 file"
        )
        self.wait_tool_done("printf '\\033[1;32mPASS")
        short = self.log.locator(".command-output").last
        expect(short.locator("span.ansi-bold.ansi-green")).to_have_text("PASS")
        expect(short.locator("span.ansi-underline")).to_have_text("tests/x.rs")
        expect(short.locator("span.ansi-fg-inverse.ansi-bg-inverse")).to_have_text("inverse")
        expect(short.locator("span.ansi-bright-yellow, span.ansi-yellow, span.ansi-red, span.ansi-bright-red").last).to_have_text("256")
        assert short.locator("pre").evaluate("pre => pre.innerText").endswith("name    size    kind\na.txt   12      file")
        expect(short.get_by_role("button", name="Copy", exact=True)).to_be_visible()
        expect(short.locator("button.output-toggle")).to_have_count(0)
        self.no_horizontal_scroll()
        short.evaluate("b => b.scrollIntoView({block: 'start'})")
        self.shot("terminal-output-colours")

    def terminal_echo(self):
        sockets = []
        self.page.on("websocket", lambda socket: sockets.append(socket))
        self.tab("Terminal")
        region = self.page.get_by_role("region", name="Terminal", exact=True)
        expect(region).to_be_visible()
        expect(self.terminal_status()).to_contain_text("your shell")
        region.click()
        self.page.keyboard.type("echo warren-$((6*7))")
        self.page.keyboard.press("Enter")
        expect(self.terminal_rows()).to_contain_text("warren-42")
        if self.size == "phone":
            for name in ["Esc", "Tab", "Ctrl", "Ctrl-C", "Up", "Down", "Left", "Right"]:
                expect(self.role("button", name)).to_be_visible()
            # Up recalls the command: it is then on the screen twice.
            self.role("button", "Up").click()
            self.page.wait_for_function(
                "() => document.querySelector('#term .xterm-rows').textContent.split('echo warren-$((6*7))').length - 1 === 2"
            )
            self.role("button", "Ctrl-C").click()
            expect(self.terminal_rows()).to_contain_text("^C")
            self.role("button", "Ctrl").click()
            expect(self.role("button", "Ctrl")).to_have_attribute("aria-pressed", "true")
            self.page.keyboard.type("l")  # Ctrl-L: clears the screen
            expect(self.role("button", "Ctrl")).to_have_attribute("aria-pressed", "false")
            expect(self.terminal_rows()).not_to_contain_text("warren-42")
            self.page.keyboard.type("echo warren-$((6*7))")
            self.page.keyboard.press("Enter")
            expect(self.terminal_rows()).to_contain_text("warren-42")
        # The shell's size is the fitted screen's, not the PTY's default 24x80.
        self.page.keyboard.type("stty size")
        self.page.keyboard.press("Enter")
        self.page.wait_for_function("() => /stty size\\s*\\d+ \\d+/.test(document.querySelector('#term .xterm-rows').textContent)")
        text = self.terminal_rows().text_content()
        rows, cols = map(int, re.search(r"stty size\s*(\d+) (\d+)", text).groups())
        n_rows = self.terminal_rows().locator(":scope > div").count()
        assert rows == n_rows and (rows, cols) != (24, 80), f"stty size {rows} {cols}, screen of {n_rows} rows"
        assert cols < 60 if self.size == "phone" else cols > 100, f"{cols} columns at {self.size} size"
        self.no_horizontal_scroll()
        self.shot("terminal")
        # Leaving the view lets go of the terminal.
        self.tab("Chat")
        deadline = time.monotonic() + 10
        while any(not s.is_closed() for s in sockets) and time.monotonic() < deadline:
            self.page.wait_for_timeout(100)
        assert sockets and all(s.is_closed() for s in sockets), "the terminal stayed attached with its view closed"
        self.tab("Terminal")
        expect(self.terminal_status()).to_contain_text("your shell")

    def terminal_reload(self):
        self.page.reload()
        expect(self.role("tab", "Terminal")).to_have_attribute("aria-selected", "true")
        expect(self.terminal_rows()).to_contain_text("warren-42")
        expect(self.terminal_status()).to_contain_text(re.compile("your shell|read-only"))

    def terminal_takeover(self):
        first = self.page
        expect(self.terminal_status(first)).to_contain_text("your shell")
        second = self.watch(self.context.new_page())
        try:
            second.goto(first.url)
            expect(self.terminal_status(second)).to_contain_text("read-only", timeout=TIMEOUT_MS)
            expect(self.terminal_rows(second)).to_contain_text("warren-42")
            take_over = second.get_by_role("button", name="Take over", exact=True)
            expect(take_over).to_be_visible()
            take_over.click()
            expect(self.terminal_status(second)).to_contain_text("your shell")
            expect(self.terminal_status(first)).to_contain_text("read-only")
            second.get_by_role("region", name="Terminal", exact=True).click()
            second.keyboard.type("echo taken-$((2+3))")
            second.keyboard.press("Enter")
            expect(self.terminal_rows(first)).to_contain_text("taken-5")
            # Typing in the read-only page does nothing but say so.
            self.page.get_by_role("region", name="Terminal", exact=True).click()
            first.keyboard.type("x")
            expect(self.terminal_status(first)).to_contain_text("read-only")
            self.role("button", "Take over").click()
            expect(self.terminal_status(first)).to_contain_text("your shell")
            expect(self.terminal_status(second)).to_contain_text("read-only")
        finally:
            second.close()

    def terminal_replay_is_not_answered(self):
        """A program's terminal queries (vim asks for the device attributes, the cursor position,
        the colours) are answered live, but not again when a reattach replays them: the answers
        would land in the shell as typed text ("2RR0;276;0c10;rgb:…: command not found")."""
        page = self.page
        sockets, sent, connected = [], [], []

        def on_socket(socket):
            if "/terminals/" in socket.url:
                sockets.append(socket)
                socket.on("framesent", lambda f: sent.append(f))
                socket.on("framereceived", lambda f: isinstance(f, str) and '"connected"' in f and connected.append(f))

        def attached():
            """Waits for this flow's attach to be `connected` as the holder."""
            deadline = time.monotonic() + TIMEOUT_MS / 1000
            while not connected and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            assert connected, "the terminal did not attach"
            assert json.loads(connected[-1])["role"] == "holder", connected[-1]
            expect(self.terminal_status()).to_contain_text("your shell")

        def typed():
            """What the page sent the shell as input (stdin frames) since `sent` was emptied."""
            return b"".join(f[1:] for f in sent if isinstance(f, bytes) and f[:1] == b"\x00")

        def let_go():
            """Closes the Terminal view and waits until its sockets are closed."""
            self.tab("Chat")
            deadline = time.monotonic() + 10
            while any(not s.is_closed() for s in sockets) and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            assert all(s.is_closed() for s in sockets), "the terminal stayed attached with its view closed"

        page.on("websocket", on_socket)
        try:
            # Attach afresh, so that this flow sees the socket it lets go of later.
            let_go()
            page.wait_for_timeout(1000)  # the previous flow's socket, not seen here, is closing
            self.tab("Terminal")
            attached()
            page.get_by_role("region", name="Terminal", exact=True).click()
            # As vim does: ask, then read the answers (noncanonical, until 2 s of quiet).
            queries = r"printf '\033[c\033[>c\033[6n\033]10;?\007\033]11;?\007'"
            page.keyboard.type(f'clear; stty -echo -icanon min 0 time 20; {queries}; a=$(cat -v); stty sane; echo "answers-1:$a:"; echo done-$((3*4))-queries')
            page.keyboard.press("Enter")
            expect(self.terminal_rows()).to_contain_text("done-12-queries")
            text = self.terminal_rows().text_content()
            for answer in [r"\^\[\[\?1;2c", r"\^\[\[>0;276;0c", r"\^\[\[\d+;\d+R", r"\^\[\]10;rgb:", r"\^\[\]11;rgb:"]:
                assert re.search(answer, text), f"the live queries were not all answered ({answer!r} missing): {text!r}"
            # Reload and attach again: the whole output, queries included, is replayed.
            let_go()
            page.reload()
            expect(self.role("tab", "Chat")).to_have_attribute("aria-selected", "true")
            sockets.clear()
            sent.clear()
            connected.clear()
            self.tab("Terminal")
            attached()
            expect(self.terminal_rows()).to_contain_text("done-12-queries")
            page.wait_for_timeout(1500)  # time for answers to go out, were any given
            assert typed() == b"", f"the replay was answered: the shell got {typed()!r}"
            page.get_by_role("region", name="Terminal", exact=True).click()
            page.keyboard.type("echo after-$((6*7))-reattach")
            page.keyboard.press("Enter")
            expect(self.terminal_rows()).to_contain_text("after-42-reattach")
            assert typed() == b"echo after-$((6*7))-reattach\r", f"the shell got {typed()!r}"
            # A query that arrives live after the replay is answered.
            page.keyboard.type(r'stty -echo -icanon min 0 time 20; printf "\033[6n"; a=$(cat -v); stty sane; echo "answers-$((1+1)):$a:"')
            page.keyboard.press("Enter")
            expect(self.terminal_rows()).to_contain_text(re.compile(r"answers-2:\^\[\[\d+;\d+R:"))
            assert "command not found" not in self.terminal_rows().text_content()
        finally:
            page.remove_listener("websocket", on_socket)
        self.no_horizontal_scroll()
        self.shot("terminal-replay")

    def agent_terminal_watch(self):
        self.tab("Chat")
        self.send("for i in $(seq 1 60); do echo tick$i; sleep 0.5; done")
        expect(self.tool("for i in").last).to_have_class(re.compile("tool-in_progress"))
        self.tab("Terminal")
        watch = self.page.get_by_role("button", name=re.compile(r"^Watch .*for i in"))
        deadline = time.monotonic() + 10
        while watch.count() == 0 and time.monotonic() < deadline:
            self.role("button", "Refresh").click()
            self.page.wait_for_timeout(300)
        watch.first.click()
        expect(self.terminal_status()).to_contain_text("read-only: watching")
        expect(self.terminal_rows()).to_contain_text(re.compile(r"tick\d+"))
        self.shot("agent-terminal")
        self.role("button", "My shell").click()
        expect(self.terminal_status()).to_contain_text("your shell")
        self.tab("Chat")
        n_cancelled = self.log.locator(".note.cancelled").count()
        self.role("button", "Cancel").click()
        expect(self.log.locator(".note.cancelled")).to_have_count(n_cancelled + 1)

    def files_upload_download(self):
        self.tab("Files")
        files = self.role("list", "Files")
        expect(files).to_be_visible()
        expect(self.role("button", "Upload")).to_be_visible()
        expect(self.role("button", "New folder")).to_be_visible()
        content = b"uploaded through the console \xe2\x9c\x93\n" + b"x" * 2_000_000
        # Every progress text shown while the upload runs.
        self.page.evaluate(
            """() => {
                window.__progress = [];
                const text = document.getElementById('upload-text');
                new MutationObserver(() => window.__progress.push(text.textContent)).observe(text, { childList: true, characterData: true, subtree: true });
            }"""
        )
        self.page.get_by_label("Upload file", exact=True).set_input_files(files=[{"name": "hello-upload.txt", "mimeType": "text/plain", "buffer": content}])
        entry = files.get_by_role("listitem", name="hello-upload.txt", exact=True)
        expect(entry).to_be_visible()
        progress = self.page.evaluate("window.__progress")
        assert progress and progress[-1] == "Uploading hello-upload.txt: 100%", progress
        expect(entry).to_contain_text("1.9 MB")
        with self.page.expect_download() as download_info:
            self.role("link", "Download hello-upload.txt").click()
        download = download_info.value
        assert download.suggested_filename == "hello-upload.txt", download.suggested_filename
        assert Path(download.path()).read_bytes() == content
        # Drag and drop.
        data_transfer = self.page.evaluate_handle(
            "() => { const d = new DataTransfer(); d.items.add(new File(['dropped\\n'], 'dropped.txt', {type: 'text/plain'})); return d; }"
        )
        self.page.locator("#panel-files").dispatch_event("drop", {"dataTransfer": data_transfer})
        expect(files.get_by_role("listitem", name="dropped.txt", exact=True)).to_be_visible()
        # New folder, rename, delete.
        self.answer_next_dialog("prompt", "made-here")
        self.role("button", "New folder").click()
        expect(files.get_by_role("listitem", name="made-here", exact=True)).to_be_visible()
        self.answer_next_dialog("prompt", "renamed.txt")
        self.role("button", "Rename hello-upload.txt").click()
        expect(files.get_by_role("listitem", name="renamed.txt", exact=True)).to_be_visible()
        expect(entry).to_have_count(0)
        self.answer_next_dialog("confirm")
        self.role("button", "Delete renamed.txt").click()
        expect(files.get_by_role("listitem", name="renamed.txt", exact=True)).to_have_count(0)
        # A change by the agent shows up by itself (files_changed).
        self.api().message(self.session_id, "echo made by the agent > by-agent.txt")
        self.n_user_messages += 1
        expect(files.get_by_role("listitem", name="by-agent.txt", exact=True)).to_be_visible(timeout=TIMEOUT_MS)
        self.api().wait_idle(self.session_id)
        self.no_horizontal_scroll()
        self.shot("files")

    def preview_http_server(self):
        # Any port: the hands have a network namespace of their own (--hands-network private).
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.tab("Chat")
        self.send(f"setsid nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > .preview.pid")
        self.api().wait_idle(self.session_id)
        self.tab("Preview")
        self.role("spinbutton", "Port").fill(str(port))
        frame = self.page.frame_locator('iframe[title="Preview"]')
        deadline = time.monotonic() + 20
        while True:
            self.role("button", "Open preview").click()
            try:
                expect(frame.get_by_text("Directory listing for /")).to_be_visible(timeout=2000)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        expect(self.page.get_by_title("Preview", exact=True)).to_be_visible()
        link = self.role("link", "Open in new tab")
        expect(link).to_have_attribute("target", "_blank")
        expect(link).to_have_attribute("rel", re.compile(r"\bnoopener\b"))
        href = link.get_attribute("href")
        assert re.fullmatch(r"http://p-[a-z0-9]{32,40}\.localhost:\d+/", href), href
        expect(frame.get_by_role("link", name="by-agent.txt")).to_be_visible()
        self.no_horizontal_scroll()
        self.shot("preview")
        api = self.api()
        api.message(self.session_id, "kill $(cat .preview.pid)")
        self.n_user_messages += 1
        api.wait_idle(self.session_id)

    def reconnect_no_duplicate(self):
        self.tab("Chat")
        box = self.role("textbox", "Message")
        box.fill("a draft that survives")
        connection = self.role("status", "Connection")
        expect(connection).to_have_text("connected")
        self.context.set_offline(True)
        try:
            expect(connection).to_have_text("reconnecting")
            api = self.api()
            api.message(self.session_id, "echo while-offline")
            self.n_user_messages += 1
            api.wait_idle(self.session_id)
            self.shot("reconnecting")
        finally:
            self.context.set_offline(False)
        expect(connection).to_have_text("connected")
        expect(self.agent_text("while-offline")).to_have_count(1)
        expect(box).to_have_value("a draft that survives")
        expect(self.log.locator(".msg.user")).to_have_count(self.n_user_messages)
        seqs = self.log.locator("[data-seq]").evaluate_all("nodes => nodes.map(n => n.dataset.seq)")
        assert len(seqs) == len(set(seqs)), f"an event is shown twice: {sorted(seqs)}"
        status, session = self.api().call("GET", f"/v1/sessions/{self.session_id}")
        assert int(self.page.locator("[data-seq]").last.get_attribute("data-seq")) <= session["last_seq"]
        box.fill("")

    def cancelled_command_says_cancelled(self):
        """The command a Cancel killed says "cancelled", not "failed" (ACP has no cancelled
        status: the agent reports it failed), and nothing is left saying "running"."""
        self.tab("Chat")
        cancel = self.role("button", "Cancel")
        self.send("sleep 31")
        tool = self.tool("sleep 31").last
        expect(tool).to_have_class(re.compile(r"\btool-in_progress\b"))
        expect(tool.locator(".tool-status")).to_have_text("running")
        cancel.click()
        expect(cancel).to_be_disabled()
        expect(tool).to_have_class(re.compile(r"\btool-cancelled\b"))
        expect(tool.locator(".tool-status")).to_have_text("cancelled")
        expect(tool.get_by_role("button", name="Watch")).to_have_count(0)
        expect(self.log.locator(".tool-status", has_text="running")).to_have_count(0)
        expect(self.page.locator("#chat-error")).to_be_hidden()
        self.no_horizontal_scroll()
        self.shot("cancelled")

    def frozen_connection_reconnects(self):
        """A connection that dies quietly (a frozen TCP stream, as after a phone moves from
        Wi-Fi to mobile data) is noticed: the console reaches the gateway through a relay on
        loopback that this flow freezes (it stops forwarding both ways and closes nothing).
        Within two heartbeat intervals the dot says reconnecting. (A) Everything frozen, new
        connections too: a message sent meanwhile runs once the relay thaws, and it and its
        output are shown once. (B) Only the event stream's connection frozen: the console
        reconnects by itself and shows what ran meanwhile, once; so does a return to the tab,
        at once. (C) A send that got no answer while offline: "Not sent" goes once the
        connection is back, the text stays in the box."""
        import select

        gateway = urlparse(self.origin)
        token = self.page.evaluate("localStorage.getItem('warren.token')")
        api = Gateway(self.origin, token)
        session_id = self.session_id

        # The interval the gateway's heartbeats have, as the console learns it.
        status, session = api.call("GET", f"/v1/sessions/{session_id}")
        assert status == 200, session
        request = urllib.request.Request(
            f"{self.origin}/v1/sessions/{session_id}/events?after={session['last_seq']}&heartbeat=event",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            block = []
            while not block or block[-1] != "":
                line = response.readline().decode()
                assert line, "the event stream ended before its first heartbeat"
                block.append(line.rstrip("\n"))
        assert "event: heartbeat" in block, block
        beat = json.loads(next(line[len("data:"):] for line in block if line.startswith("data:")))
        assert not any(line.startswith("id:") for line in block), f"a heartbeat has no id: {block}"
        interval_s = beat["interval_ms"] / 1000
        assert beat["type"] == "heartbeat" and 0 < interval_s <= 5, beat

        class Link:
            def __init__(self, frozen):
                self.frozen = frozen
                self.requests = []  # the request lines the browser sent on it
                self.sockets = []

        links, lock, stop = [], threading.Lock(), threading.Event()
        freeze_new = [False]
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)

        def pump(link, source, target, upstream):
            try:
                while not stop.is_set():
                    if link.frozen:
                        time.sleep(0.02)
                        continue
                    ready, _, _ = select.select([source], [], [], 0.1)
                    if not ready:
                        continue
                    data = source.recv(65536)
                    if not data:
                        target.shutdown(socket.SHUT_WR)
                        return
                    if upstream and re.match(rb"[A-Z]+ /", data):
                        link.requests.append(data.split(b"\r\n", 1)[0].decode(errors="replace"))
                    target.sendall(data)
            except (OSError, ValueError):
                # The other direction closed the sockets (select on a closed one: ValueError).
                pass
            finally:
                for s in link.sockets:
                    try:
                        s.close()
                    except OSError:
                        pass

        def accept():
            while not stop.is_set():
                try:
                    client, _ = listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    return
                client.settimeout(None)
                try:
                    server = socket.create_connection((gateway.hostname, gateway.port), timeout=5)
                    server.settimeout(None)
                except OSError:
                    client.close()
                    continue
                with lock:
                    link = Link(freeze_new[0])
                    link.sockets = [client, server]
                    links.append(link)
                for args in [(link, client, server, True), (link, server, client, False)]:
                    threading.Thread(target=pump, args=args, daemon=True).start()

        def freeze(which=lambda link: True, new_too=False):
            with lock:
                freeze_new[0] = new_too
                frozen = [link for link in links if which(link)]
                for link in frozen:
                    link.frozen = True
            assert frozen, "nothing to freeze"

        def thaw():
            with lock:
                freeze_new[0] = False
                for link in links:
                    link.frozen = False

        def n_stream_requests():
            with lock:
                return sum(1 for link in links for line in link.requests if "/events?" in line)

        threading.Thread(target=accept, daemon=True).start()
        relay = f"http://127.0.0.1:{listener.getsockname()[1]}"
        context = self.browser.new_context(**SIZES[self.size])
        context.set_default_timeout(TIMEOUT_MS)
        context.add_init_script(f"localStorage.setItem('warren.token', {json.dumps(token)})")
        problems = []
        page = context.new_page()
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))

        def on_console(message):
            # Closing a frozen connection, or the offline part, makes the browser log failures.
            if message.type == "error" and not re.search(EXPECTED_NETWORK_ERRORS.pattern + r"|ERR_EMPTY_RESPONSE|ERR_CONNECTION_RESET", message.text):
                problems.append(f"console error: {message.text}")

        page.on("console", on_console)
        role = lambda r, name: page.get_by_role(r, name=name, exact=True)  # noqa: E731
        log = role("log", "Conversation")
        connection = role("status", "Connection")
        box = role("textbox", "Message")
        error = page.locator("#chat-error")

        def agent(text):
            return log.locator(".msg.agent").filter(has_text=re.compile("^" + re.escape(text) + "$"))

        def no_duplicates(what):
            seqs = log.locator("[data-seq]").evaluate_all("nodes => nodes.map(n => n.dataset.seq)")
            assert len(seqs) == len(set(seqs)), f"{what}: an event is shown twice: {sorted(seqs)}"

        def watch_dot():
            # The dot's words as they change, with the page's clock: a reconnect through a
            # fresh connection says "reconnecting" for a moment only.
            started = page.evaluate(
                """() => {
                    const dot = document.getElementById('connection');
                    window.__dot = [];
                    window.__dotObserver?.disconnect();
                    window.__dotObserver = new MutationObserver(() => window.__dot.push([performance.now(), dot.textContent]));
                    window.__dotObserver.observe(dot, { childList: true, characterData: true, subtree: true });
                    return performance.now();
                }"""
            )
            return started

        def reconnecting_seen(what, started):
            page.wait_for_function(
                "() => window.__dot.some(([, text]) => text === 'reconnecting')", timeout=int((2 * interval_s + 5) * 1000)
            )
            took = (page.evaluate("window.__dot.find(([, text]) => text === 'reconnecting')[0]") - started) / 1000
            # Two intervals, and a little for the page's timer.
            assert took <= 2 * interval_s + 0.75, f"{what}: reconnecting after {took:.1f} s; heartbeat {interval_s} s"
            return took

        try:
            page.goto(f"{relay}/#session={session_id}&view=chat")
            expect(connection).to_have_text("connected")
            expect(log).not_to_have_attribute("aria-busy", "true")
            n_user = log.locator(".msg.user").count()
            assert n_user > 0, "the session's history is shown through the relay"

            # (A) Everything frozen, new connections too.
            started = watch_dot()
            freeze(new_too=True)
            took_a = reconnecting_seen("frozen", started)
            box.fill("echo frozen-$((6*7))")
            box.press("Enter")
            page.wait_for_timeout(int(interval_s * 1000))
            expect(connection).to_have_text("reconnecting")
            if self.size == "phone":
                page.screenshot(path=str(self.shots / f"{self.size}-frozen.png"))
            thaw()
            expect(agent("frozen-42")).to_have_count(1)
            expect(connection).to_have_text("connected")
            expect(log.locator(".msg.user")).to_have_count(n_user + 1)
            expect(log.locator(".msg.user").last).to_have_text("echo frozen-$((6*7))")
            expect(box).to_have_value("")
            expect(error).to_be_hidden()
            api.wait_idle(session_id)
            frozen_tool = log.locator(".tool").filter(has=page.locator("code.tool-title", has_text="echo frozen"))
            expect(frozen_tool).to_have_count(1)
            expect(frozen_tool).to_have_class(re.compile(r"\btool-completed\b"))
            no_duplicates("after the thaw")
            n_user += 1

            # (B) Only the event stream's connection freezes; the console reconnects by itself
            # through a fresh connection and shows what ran meanwhile.
            started = watch_dot()
            freeze(lambda link: any("/events?" in r for r in link.requests[-1:]))
            api.message(session_id, "echo behind-$((2*3))")
            self.n_user_messages += 1
            reconnecting_seen("the stream frozen", started)
            expect(connection).to_have_text("connected")
            expect(agent("behind-6")).to_have_count(1)
            expect(log.locator(".msg.user")).to_have_count(n_user + 1)
            api.wait_idle(session_id)
            no_duplicates("after reconnecting by itself")
            n_user += 1
            self.n_user_messages += 1  # the frozen one, sent from the relay's page

            # A return to the tab opens a fresh stream at once, before the silence is noticed.
            expect(connection).to_have_text("connected")
            page.wait_for_timeout(300)
            freeze(lambda link: any("/events?" in r for r in link.requests[-1:]))
            before = n_stream_requests()
            assert page.evaluate("document.hidden") is False
            page.evaluate("document.dispatchEvent(new Event('visibilitychange'))")
            # Sooner than the frozen stream's silence could be noticed (at least one interval
            # away: it heard a heartbeat at most one interval ago).
            deadline = time.monotonic() + interval_s * 0.6
            while n_stream_requests() == before and time.monotonic() < deadline:
                page.wait_for_timeout(50)
            assert n_stream_requests() > before, "no new stream when the tab came back"
            api.message(session_id, "echo woken-$((3*3))")
            self.n_user_messages += 1
            expect(agent("woken-9")).to_have_count(1)
            expect(connection).to_have_text("connected")
            api.wait_idle(session_id)
            no_duplicates("after the tab came back")
            n_user += 1

            # (C) Offline: a send gets no answer; "Not sent" goes when the connection is back.
            context.set_offline(True)
            try:
                expect(connection).to_have_text("reconnecting")
                box.fill("echo not-yet")
                box.press("Enter")
                expect(error).to_contain_text("Not sent")
                width = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
                assert width[0] <= width[1], f"the page scrolls sideways: {width}"
            finally:
                context.set_offline(False)
            expect(connection).to_have_text("connected")
            expect(error).to_be_hidden()
            expect(box).to_have_value("echo not-yet")
            expect(log.locator(".msg.user")).to_have_count(n_user)
            box.fill("")
            assert not problems, "; ".join(problems)
            print(f"note    {self.size:7} frozen connection noticed after {took_a:.1f} s (heartbeat {interval_s} s)", flush=True)
        finally:
            thaw()
            context.close()
            stop.set()
            listener.close()
            with lock:
                for link in links:
                    for s in link.sockets:
                        try:
                            s.close()
                        except OSError:
                            pass

    def sign_in_token_and_sign_out(self):
        """Another browser signs in with a device token of the same owner (paired through the
        API: signing out revokes the device, so it cannot be the main page's own token), sees
        the session, and signs out once it confirmed."""
        status, pair = self.api().call("POST", "/v1/devices/pair")
        assert status == 201, (status, pair)
        device_id = f"token-{self.size}-{int(time.time() * 1000) % 10**9}"
        status, registered = Gateway(self.origin).call("POST", "/v1/devices", {"device_id": device_id, "pair_code": pair["code"]})
        assert status == 201, (status, registered)
        token = registered["token"]
        context = self.browser.new_context(**SIZES[self.size])
        context.set_default_timeout(TIMEOUT_MS)
        page = self.watch(context.new_page())
        try:
            page.goto(self.origin + "/")
            page.get_by_role("textbox", name="Device token", exact=True).fill(token)
            page.get_by_role("button", name="Sign in", exact=True).click()
            sessions = page.get_by_role("list", name="Sessions", exact=True)
            expect(sessions.get_by_role("button", name=self.title, exact=True)).to_be_visible()
            n_problems = len(self.problems)
            page.get_by_role("button", name="Sign out", exact=True).click()
            page.get_by_role("dialog", name="Sign out of this browser?", exact=True).get_by_role("button", name="Sign out and revoke", exact=True).click()
            expect(page.get_by_role("textbox", name="App key", exact=True)).to_be_visible()
            assert page.evaluate("localStorage.getItem('warren.token')") is None
            assert Gateway(self.origin, token).call("GET", "/v1/sessions")[0] == 401
            # What the browser logs for a request the revoked token made on its way out.
            self.problems[n_problems:] = [p for p in self.problems[n_problems:] if "status of 401" not in p]
        finally:
            context.close()
            self.api().call("DELETE", f"/v1/devices/{device_id}")

    def network_request_and_view(self):
        """A destination no rule covers is asked in the chat and answered there; the Network
        view shows it and edits the session's rules (network.md)."""
        api = self.api()
        status, body = api.call("PUT", f"/v1/sessions/{self.session_id}/egress", {"policy": "ask"})
        assert status == 200, (status, body)
        self.tab("Chat")
        self.send("curl -sS -m 60 -o /dev/null -w 'NET %{http_code}\\n' https://pypi.org/simple/six/")
        card = self.page.get_by_role("group", name="Network permission request", exact=True).last
        expect(card).to_contain_text("pypi.org:443")
        self.no_horizontal_scroll()
        self.tap_targets()
        self.shot("egress-request")
        card.get_by_role("button", name="Allow once", exact=True).click()
        expect(card).to_contain_text("Allowed once")
        expect(self.agent_text("NET 200")).to_have_count(1)
        self.wait_tool_done("curl")
        self.tab("Network")
        expect(self.role("combobox", "Policy")).to_have_value("ask")
        destination = self.role("button", "Allow pypi.org:443")
        expect(destination).to_be_visible()
        box = self.role("textbox", "Allow rule")
        box.fill("bad rule")
        self.role("button", "Add allow rule").click()
        expect(self.page.locator("#allow-error")).to_contain_text("bad rule")
        expect(box).to_have_value("bad rule")
        box.fill("github.com")
        self.role("button", "Add allow rule").click()
        expect(self.role("button", "Remove github.com")).to_be_visible()
        status, body = api.call("GET", f"/v1/sessions/{self.session_id}/egress")
        assert status == 200 and body["allow"] == ["github.com"], (status, body)
        self.no_horizontal_scroll()
        self.tap_targets()
        self.shot("network")
        self.role("button", "Remove github.com").click()
        expect(self.role("button", "Remove github.com")).to_have_count(0)
        self.role("combobox", "Policy").select_option("registries")
        deadline = time.monotonic() + 10
        while api.call("GET", f"/v1/sessions/{self.session_id}/egress")[1]["policy"] != "registries":
            assert time.monotonic() < deadline, "the policy select sends PUT"
            time.sleep(0.1)
        self.tab("Chat")

    def credential_line_and_switch(self):
        """A request the egress proxy set a credential on is a quiet line in the chat, folded
        when repeated; the Network view turns the session's credential off and on (network.md
        "Credentials at the edge"). The gateway sets `npm` on requests to the npm registry."""
        api = self.api()
        self.tab("Chat")
        url = "https://registry.npmjs.org/is-number"
        self.send(f"curl -sS -m 60 -o /dev/null -o /dev/null -w 'CRED %{{http_code}}.' {url} {url}; echo")
        expect(self.agent_text("CRED 200.CRED 200.")).to_have_count(1)
        self.wait_tool_done("CRED")
        line = self.page.locator(".note.credential").last
        expect(line).to_contain_text("npm")
        expect(line).to_contain_text("GET registry.npmjs.org/is-number")
        expect(line).to_contain_text("×2")
        line.scroll_into_view_if_needed()
        box = line.bounding_box()
        assert box and box["height"] >= 12, f"the line is seen, not squeezed by the log: {box}"
        self.no_horizontal_scroll()
        self.shot("credential-used")
        self.tab("Network")
        switch = self.role("switch", "Use npm")
        expect(switch).to_have_attribute("aria-checked", "true")
        switch.click()
        expect(switch).to_have_attribute("aria-checked", "false")
        status, body = api.call("GET", f"/v1/sessions/{self.session_id}/egress")
        assert status == 200 and body["credentials"] == [], (status, body)
        self.no_horizontal_scroll()
        self.tap_targets()
        self.shot("network-credentials")
        switch.click()
        expect(switch).to_have_attribute("aria-checked", "true")
        status, body = api.call("GET", f"/v1/sessions/{self.session_id}/egress")
        assert status == 200 and body["credentials"] == ["npm"], (status, body)
        self.tab("Chat")

    def accessible_names(self):
        """The table of spec/console.md; controls only shown in some states are checked by the flows that reach them."""
        self.tab("Chat")
        checks = [
            ("button", "Sign out"), ("button", "Delete session"),
            ("tab", "Chat"), ("tab", "Terminal"), ("tab", "Files"), ("tab", "Preview"), ("tab", "Network"),
            ("log", "Conversation"), ("textbox", "Message"), ("button", "Send"), ("button", "Cancel"),
            ("status", "Connection"),
        ]
        if self.size == "phone":
            checks.append(("button", "Sessions"))
        else:
            checks += [("list", "Sessions"), ("textbox", "Session title"), ("button", "New session")]
        for role, name in checks:
            expect(self.role(role, name)).to_be_visible()
        self.tap_targets()
        if self.size == "phone":
            self.role("button", "Sessions").click()
            for role, name in [("list", "Sessions"), ("textbox", "Session title"), ("button", "New session")]:
                expect(self.role(role, name)).to_be_visible()
            self.role("list", "Sessions").get_by_role("button", name=self.title, exact=True).click()
        self.tab("Terminal")
        expect(self.page.get_by_role("region", name="Terminal", exact=True).locator(".xterm")).to_be_visible()
        self.tap_targets()
        self.tab("Files")
        expect(self.role("list", "Files")).to_be_visible()
        self.tap_targets()
        self.tab("Preview")
        expect(self.role("spinbutton", "Port")).to_be_visible()
        expect(self.role("button", "Open preview")).to_be_visible()
        self.tap_targets()
        self.tab("Chat")

    def isolation_warning(self):
        """Hands without isolation are said plainly (the answer is rewritten: this gateway sandboxes)."""
        warning = self.page.get_by_text("No isolation:")
        expect(warning).to_be_hidden()

        def unconfined(route):
            response = route.fetch()
            body = response.json()
            for session in body["sessions"]:
                session["isolation"] = "none"
            route.fulfill(response=response, json=body)

        self.page.route("**/v1/sessions", unconfined)
        try:
            self.page.reload()
            expect(warning).to_be_visible()
            expect(self.page.locator("#session-state")).to_contain_text("no isolation")
            self.no_horizontal_scroll()
            self.shot("isolation-warning")
        finally:
            self.page.unroute("**/v1/sessions")
        self.page.reload()
        self.tab("Chat")
        expect(warning).to_be_hidden()

    def dark_scheme(self):
        """Light and dark follow the system."""
        self.page.emulate_media(color_scheme="dark")
        try:
            background = self.page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(13, 17, 23)", f"dark background {background}"
            self.shot("chat-dark")
        finally:
            self.page.emulate_media(color_scheme="light")
        assert self.page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"

    def rename_session(self):
        renamed = self.title + " renamed"
        self.role("button", "Rename session").click()
        box = self.role("textbox", "New title")
        expect(box).to_have_value(self.title)
        box.fill(renamed)
        self.role("button", "Save title").click()
        expect(self.page.get_by_role("heading", name=renamed, exact=True)).to_be_visible()
        expect(box).to_be_hidden()
        token = self.page.evaluate("localStorage.getItem('warren.token')")
        status, body = Gateway(self.origin, token).call("GET", f"/v1/sessions/{self.session_id}")
        assert status == 200 and body["title"] == renamed, (status, body)
        self.title = renamed

    def installable_and_offline(self):
        """phone.md "Installable": the manifest is linked and valid, the service worker controls
        the page after a reload and caches the shell, and Chromium finds nothing missing to
        install the console; offline, a reload opens the console from the worker's cache and it
        says it is offline; back online it reconnects, in the session it was showing."""
        import tempfile

        page = self.page
        self.tab("Chat")
        connection = self.role("status", "Connection")
        expect(connection).to_have_text("connected")
        href = page.evaluate("document.querySelector('link[rel=manifest]').href")
        assert href == self.origin + "/manifest.webmanifest", href
        manifest = page.evaluate("async (url) => (await fetch(url)).json()", href)
        for field, value in [("name", "Warren"), ("short_name", "Warren"), ("start_url", "/"), ("scope", "/"), ("display", "standalone")]:
            assert manifest.get(field) == value, f"manifest {field}: {manifest}"
        purposes = {(icon["sizes"], icon.get("purpose", "any")) for icon in manifest["icons"]}
        assert {("192x192", "any"), ("512x512", "any"), ("512x512", "maskable")} <= purposes, manifest["icons"]
        assert page.locator('meta[name="theme-color"][media*="dark"]').count() == 1

        # Registered as the page loaded; it controls the page from the next load on.
        worker = page.evaluate("navigator.serviceWorker.ready.then((r) => [r.scope, r.active.scriptURL])")
        assert worker == [self.origin + "/", self.origin + "/sw.js"], worker
        page.reload()
        page.wait_for_function("navigator.serviceWorker.controller !== null")
        expect(connection).to_have_text("connected")
        cached = page.evaluate(
            """async () => {
                const names = (await caches.keys()).filter((name) => name.startsWith('warren-shell-'));
                const cache = await caches.open(names[0]);
                return [names, (await cache.keys()).map((request) => new URL(request.url).pathname)];
            }"""
        )
        names, paths = cached
        assert len(names) == 1, names
        for path in ["/", "/console/main.js", "/console/app.css", "/console/vendor/xterm/xterm.mjs", "/console/icons/icon-192.png"]:
            assert path in paths, f"{path} not cached: {paths}"
        assert not any(p.startswith("/v1/") for p in paths), paths
        # Chromium's own verdict, in a profile on disk: every context of `self.browser` is off the
        # record, which alone makes Chromium answer "in-incognito" (no app installs from there).
        with tempfile.TemporaryDirectory() as profile:
            context = self.browser.browser_type.launch_persistent_context(
                profile, executable_path="/usr/bin/chromium", headless=True, **SIZES[self.size]
            )
            try:
                context.set_default_timeout(TIMEOUT_MS)
                fresh = self.watch(context.new_page())
                fresh.goto(self.origin + "/")
                fresh.evaluate("navigator.serviceWorker.ready.then(() => true)")
                fresh.reload()
                fresh.wait_for_function("navigator.serviceWorker.controller !== null")
                cdp = context.new_cdp_session(fresh)
                errors = cdp.send("Page.getInstallabilityErrors")["installabilityErrors"]
                assert errors == [], f"installability errors: {errors}"
                app_manifest = cdp.send("Page.getAppManifest")
                assert app_manifest.get("url") == href and not app_manifest.get("errors"), app_manifest
            finally:
                context.close()

        offline_note = self.role("status", "Offline")
        expect(offline_note).to_be_hidden()
        n_problems = len(self.problems)
        self.context.set_offline(True)
        try:
            response = page.reload()
            assert response and response.from_service_worker, "the page came from the worker's cache"
            expect(offline_note).to_be_visible()
            expect(offline_note).to_contain_text("Offline")
            expect(connection).to_have_text("offline")
            expect(self.role("button", "Sign out")).to_be_visible()
            assert page.evaluate("fetch('/v1/sessions').then(() => 'answered', () => 'failed')") == "failed", "the API is not cached"
            self.no_horizontal_scroll()
            self.shot("offline")
        finally:
            self.context.set_offline(False)
            # What the browser logs for the requests the network refused while it was away.
            self.problems[n_problems:] = [p for p in self.problems[n_problems:] if not EXPECTED_NETWORK_ERRORS.search(p)]
        expect(offline_note).to_be_hidden()
        expect(connection).to_have_text("connected")
        expect(self.page.get_by_role("heading", name=self.title, exact=True)).to_be_visible()
        expect(self.log.locator(".msg.user")).to_have_count(self.n_user_messages)

    def delete_session(self):
        self.answer_next_dialog("confirm")
        self.role("button", "Delete session").click()
        expect(self.role("list", "Sessions")).to_be_visible()
        expect(self.role("list", "Sessions").get_by_role("button", name=self.title, exact=True)).to_have_count(0)
        status, _ = Gateway(self.origin, self.page.evaluate("localStorage.getItem('warren.token')")).call("GET", f"/v1/sessions/{self.session_id}")
        assert status == 404, status

    FLOWS = [
        "sign_in_register", "create_session", "rename_session", "echo_hi", "compact_layout_and_keyboard", "shift_enter_is_a_newline", "permission_rm",
        "back_navigation", "cancel_turn", "cancelled_command_says_cancelled", "prompt_answer_box", "agent_html_is_text", "shell_output_is_terminal_text", "terminal_echo", "terminal_reload", "terminal_takeover",
        "terminal_replay_is_not_answered", "agent_terminal_watch", "files_upload_download", "file_viewer", "checkpoints_diff_rewind_fork", "preview_http_server", "network_request_and_view",
        "credential_line_and_switch", "reconnect_no_duplicate", "frozen_connection_reconnects",
        "sign_in_token_and_sign_out", "accessible_names", "isolation_warning", "dark_scheme", "installable_and_offline",
        "pair_second_device", "devices_list_and_revoke", "sign_out_asks_first", "push_notification_shows_and_answers", "delete_session",
    ]

    def run(self):
        only = set(filter(None, (self.args.flows or "").split(",")))
        for name in self.FLOWS:
            if only and name not in only and name not in ("sign_in_register", "create_session"):
                continue
            self.flow = name
            WATCHDOG.arm(f"{self.size} {name}")
            self.dialog_answers.clear()  # what a failed flow queued is not the next one's
            n_problems = len(self.problems)
            started = time.monotonic()
            try:
                getattr(self, name)()
                self.no_horizontal_scroll()
                error = None
            except Exception as exc:  # noqa: BLE001 - a flow's failure is reported, the run goes on
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
                if self.args.verbose:
                    traceback.print_exc()
                try:
                    self.shot(f"failed-{name}")
                except Exception:  # noqa: BLE001
                    pass
            seconds = time.monotonic() - started
            problems = self.problems[n_problems:]
            if error or problems:
                self.failed = True
                print(f"FAIL {self.size:7} {name} ({seconds:.1f} s): {error or ''} {'; '.join(problems)}".rstrip(), flush=True)
            else:
                print(f"ok   {self.size:7} {name} ({seconds:.1f} s)", flush=True)
        WATCHDOG.arm(f"{self.size} clean-up")
        self.clean_up()
        self.context.close()
        return not self.failed

    def clean_up(self):
        """Deletes the session if a failed flow left it (its hands would outlive the gateway)."""
        if not self.session_id:
            return
        try:
            token = self.page.evaluate("localStorage.getItem('warren.token')")
            if token:
                Gateway(self.origin, token).call("DELETE", f"/v1/sessions/{self.session_id}")
        except Exception as exc:  # noqa: BLE001 - best effort, the flows' results stand
            print(f"note    {self.size:7} could not delete session {self.session_id}: {exc}", flush=True)


# ---- measurements ----


def measure_first_load(browser, origin):
    context = browser.new_context()
    page = context.new_page()
    responses = []
    page.on("requestfinished", lambda request: responses.append(request))
    page.goto(origin + "/", wait_until="networkidle")
    total = 0
    lines = []
    for request in responses:
        sizes = request.sizes()
        n = sizes["responseBodySize"] + sizes["responseHeadersSize"]
        total += n
        lines.append(f"{urlparse(request.url).path} {n}")
    context.close()
    return total, lines


def make_long_session(gateway, n_events):
    """A session with at least `n_events` events: many short turns (7 events each)."""
    status, session = gateway.call("POST", "/v1/sessions", {"title": f"{n_events} events"})
    assert status == 201, session
    session_id = session["id"]
    try:
        n = 0
        while True:
            status, session = gateway.call("GET", f"/v1/sessions/{session_id}")
            if session["last_seq"] >= n_events:
                return session_id, session["last_seq"]
            gateway.message(session_id, f"echo line {n}")
            gateway.wait_idle(session_id)
            n += 1
    except BaseException:
        gateway.call("DELETE", f"/v1/sessions/{session_id}")
        raise


def measure_history_render(browser, origin, token, session_id, n_runs=5):
    times = []
    for _ in range(n_runs):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.add_init_script(f"localStorage.setItem('warren.token', {json.dumps(token)})")
        page = context.new_page()
        page.goto(f"{origin}/#session={session_id}&view=chat")
        page.wait_for_function("() => performance.getEntriesByName('warren:conversation-rendered').length > 0", timeout=60_000)
        times.append(page.evaluate("performance.getEntriesByName('warren:conversation-rendered')[0].startTime"))
        n_items = page.locator("#log > *").count()
        context.close()
    return statistics.median(times), times, n_items


def measure_keystroke_echo(browser, origin, token, session_id, n_keys=50):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.add_init_script(f"localStorage.setItem('warren.token', {json.dumps(token)})")
    page = context.new_page()
    page.goto(f"{origin}/#session={session_id}&view=terminal")
    expect(page.get_by_role("status", name="Terminal status", exact=True)).to_contain_text("your shell", timeout=TIMEOUT_MS)
    page.get_by_role("region", name="Terminal", exact=True).click()
    page.keyboard.type(": ")
    page.wait_for_timeout(300)
    page.evaluate(
        """() => {
            window.__keydownAt = 0;
            document.addEventListener('keydown', () => { window.__keydownAt = performance.now(); }, true);
        }"""
    )
    letters = "abcdefghijklmnopqrstuvwxyz"
    typed = ""
    samples = []
    for i in range(n_keys):
        letter = letters[i % len(letters)]
        typed += letter
        page.evaluate(
            """(expected) => {
                const rows = document.querySelector('.xterm-rows');
                window.__echoAt = new Promise((resolve) => {
                    const check = () => rows.textContent.replace(/\\s/g, '').includes(expected);
                    const observer = new MutationObserver(() => {
                        if (check()) { observer.disconnect(); resolve(performance.now()); }
                    });
                    observer.observe(rows, { subtree: true, childList: true, characterData: true });
                });
            }""",
            ":" + typed,
        )
        page.keyboard.press(letter)
        echo_at = page.evaluate("window.__echoAt")
        samples.append(echo_at - page.evaluate("window.__keydownAt"))
    page.keyboard.press("Control+u")
    context.close()
    return statistics.median(samples), samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8080")
    parser.add_argument("--app-key", required=True)
    parser.add_argument("--shots", required=True, help="directory for the screenshots")
    parser.add_argument("--sizes", default="phone,desktop", help="comma-separated; empty for none")
    parser.add_argument("--measure", action="store_true", help="also measure load size, history render and keystroke echo")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--flows", default="", help="comma-separated flows to run (after signing in and creating a session); empty for all")
    args = parser.parse_args()
    Path(args.shots).mkdir(parents=True, exist_ok=True)
    origin = args.url.rstrip("/")
    ok = True
    expect.set_options(timeout=TIMEOUT_MS)
    WATCHDOG.arm("start")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True)
        try:
            total, _ = measure_first_load(browser, origin)
            WATCHDOG.disarm()
            verdict = "ok  " if total < 300_000 else "FAIL"
            ok &= total < 300_000
            print(f"{verdict} first_load_size: {total} bytes on the wire (target < 300000)", flush=True)
            for size in filter(None, args.sizes.split(",")):
                ok &= Run(args, browser, size).run()
            WATCHDOG.disarm()
            if args.measure:
                run_measurements(browser, origin, args)
        finally:
            WATCHDOG.arm("end")
            browser.close()
    WATCHDOG.disarm()
    print("all flows passed" if ok else "some flows FAILED", flush=True)
    return 0 if ok else 1


def run_measurements(browser, origin, args):
    total, lines = measure_first_load(browser, origin)
    print(f"measure first load: {total} bytes compressed ({', '.join(lines)})", flush=True)
    device = f"measure-{int(time.time())}"
    status, answer = Gateway(origin).call("POST", "/v1/devices", {"device_id": device}, {"X-App-Key": args.app_key})
    assert status == 201, answer
    gateway = Gateway(origin, answer["token"])
    started = time.monotonic()
    session_id, n_events = make_long_session(gateway, 2000)
    try:
        print(f"measure made a session of {n_events} events in {time.monotonic() - started:.0f} s", flush=True)
        median, times, n_items = measure_history_render(browser, origin, gateway.token, session_id)
        print(f"measure history render: median {median:.0f} ms from navigation to {n_events} events on screen ({n_items} items; runs {[round(t) for t in times]}) (target < 500)", flush=True)
        median, samples = measure_keystroke_echo(browser, origin, gateway.token, session_id)
        print(f"measure keystroke echo: median {median:.1f} ms of {len(samples)} (min {min(samples):.1f}, max {max(samples):.1f}) (target < 30)", flush=True)
    finally:
        gateway.call("DELETE", f"/v1/sessions/{session_id}")


if __name__ == "__main__":
    sys.exit(main())
