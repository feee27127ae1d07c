"""Browser flows of the phone app: history navigation, the compact keyboard-aware layout, prompts with an answer box, the file viewer.

A mixin of run.py's `Run`: each method is one flow, named in `Run.FLOWS`, and uses Run's
helpers (`self.page`, `self.role`, `self.shot`, `self.api`, ...).
"""

import re
import time
import urllib.request
from urllib.parse import quote, urlparse

from playwright.sync_api import expect

# The phone's screen, and what its visual viewport is with the on-screen keyboard open (a
# 390x844 phone's keyboard takes about 394 px).
PHONE = {"width": 390, "height": 844}
PHONE_WITH_KEYBOARD = {"width": 390, "height": 450}


class LayoutFlows:
    # ---- helpers ----

    def put_file(self, path, data):
        """Writes `data` to `path` of the session's workspace (`PUT /files/content`)."""
        token = self.page.evaluate("localStorage.getItem('warren.token')")
        request = urllib.request.Request(
            f"{self.origin}/v1/sessions/{self.session_id}/files/content?path={quote(path)}",
            data=data,
            method="PUT",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status in (200, 201), f"PUT {path}: {response.status}"

    def at_list(self, page):
        """`page` shows the session list and no session, and its address names none."""
        sessions = page.get_by_role("list", name="Sessions", exact=True)
        heading = page.get_by_role("heading", name=self.title, exact=True)
        if self.size == "phone":
            expect(sessions).to_be_visible()
            expect(heading).to_be_hidden()
        else:
            expect(sessions).to_be_visible()
            expect(page.locator("#no-session")).to_be_visible()
            expect(heading).to_be_hidden()
        assert urlparse(page.url).fragment == "", page.url
        assert page.url.startswith(self.origin), f"Back left the console: {page.url}"

    def at_view(self, page, name):
        """`page` shows this session's view `name`."""
        expect(page.get_by_role("heading", name=self.title, exact=True)).to_be_visible()
        expect(page.get_by_role("tab", name=name, exact=True)).to_have_attribute("aria-selected", "true")
        assert f"session={self.session_id}" in page.url and f"view={name.lower()}" in page.url, page.url

    # ---- flows ----

    def back_navigation(self):
        """History: every move into a session or a view is an entry; Back goes back through
        them and from a session to the list, never out of the console (a page opened at a
        session's link has the list below it); Forward comes back. `#/s/{id}/r/{request}` (a
        notification's link) opens the chat scrolled to that request, marked."""
        page = self.page
        self.tab("Chat")
        # A request to point at, then enough after it to scroll it out of view.
        self.send("rm -f no-such-file")
        group = page.get_by_role("group", name="Permission request", exact=True).last
        expect(group).to_contain_text("rm -f no-such-file")
        request_id = group.get_attribute("data-request-id")
        assert request_id, "the request's card names its request"
        group.get_by_role("button", name="Don't run it", exact=True).click()
        expect(group).to_contain_text("Answered: Don't run it")
        self.api().wait_idle(self.session_id)
        self.send("seq 1 35")
        self.wait_tool_done("seq 1 35")

        fresh = self.watch(self.context.new_page())
        try:
            fresh.goto(f"{self.origin}/#/s/{quote(self.session_id)}/r/{quote(request_id)}")
            card = fresh.locator(".permission[data-request-id]").filter(has=fresh.get_by_text("rm -f no-such-file"))
            expect(card).to_have_class(re.compile(r"\brevealed\b"))
            placement = card.evaluate(
                """card => {
                    const log = card.closest('.log');
                    const c = card.getBoundingClientRect(), l = log.getBoundingClientRect();
                    return { inView: c.top >= l.top - 1 && c.bottom <= l.bottom + 1,
                             atEnd: log.scrollHeight - log.scrollTop - log.clientHeight < 20 };
                }"""
            )
            assert placement["inView"], f"the request is not in view: {placement}"
            assert not placement["atEnd"], "the log is at its end, not at the request"
            self.at_view(fresh, "Chat")
            fresh.screenshot(path=str(self.shots / f"{self.size}-deep-link-request.png"))

            # Views are entries; Back goes through them to the list and stays in the console.
            for name in ["Files", "Network"]:
                fresh.get_by_role("tab", name=name, exact=True).click()
                self.at_view(fresh, name)
            fresh.go_back()
            self.at_view(fresh, "Files")
            fresh.go_back()
            self.at_view(fresh, "Chat")
            fresh.go_back()
            self.at_list(fresh)
            fresh.go_forward()
            self.at_view(fresh, "Chat")
            fresh.go_forward()
            self.at_view(fresh, "Files")
            # Into a folder and back out of it.
            self.put_file("nav-dir/inner.txt", b"inner\n")
            files = fresh.get_by_role("list", name="Files", exact=True)
            files.get_by_role("button", name="nav-dir/", exact=True).click()
            expect(files.get_by_role("listitem", name="inner.txt", exact=True)).to_be_visible()
            assert "dir=nav-dir" in fresh.url, fresh.url
            fresh.go_back()
            expect(files.get_by_role("listitem", name="nav-dir", exact=True)).to_be_visible()
            expect(fresh.locator("#files-path")).to_have_text("/")
            if self.size == "phone":
                # "Sessions" goes back to the list's entry, so Forward returns to the session.
                fresh.get_by_role("button", name="Sessions", exact=True).click()
                self.at_list(fresh)
                fresh.go_forward()
                self.at_view(fresh, "Chat")
            else:
                fresh.go_back()
                fresh.go_back()
                self.at_list(fresh)
                fresh.go_forward()
                self.at_view(fresh, "Chat")
            # Into the session from the list is an entry too.
            fresh.go_back()
            self.at_list(fresh)
            fresh.get_by_role("list", name="Sessions", exact=True).get_by_role("button", name=self.title, exact=True).click()
            self.at_view(fresh, "Chat")
            fresh.go_back()
            self.at_list(fresh)
            self.no_horizontal_scroll()
        finally:
            fresh.close()
        # The old form of the address, in bookmarks, still opens the view; followed in the page
        # (a new entry the console did not make), it too has the list below it.
        page.goto(f"{self.origin}/#session={self.session_id}&view=network")
        self.at_view(page, "Network")
        page.go_back()
        self.at_list(page)
        page.go_forward()
        self.at_view(page, "Network")
        self.tab("Chat")

    def compact_layout_and_keyboard(self):
        """The session's header (the bar, the title line, the tabs) takes a small part of the
        screen; with the on-screen keyboard open it folds into one line and the message box and
        the terminal's key bar stay above the keys. Headless Chromium has no on-screen keyboard:
        what one does is what this flow does, a focused text field and a visual viewport of
        390x450 (the page sees `visualViewport.height` 450, as with a real keyboard)."""
        page = self.page
        self.tab("Chat")
        viewport = page.viewport_size
        header = page.evaluate("() => document.querySelector('.session .tabs').getBoundingClientRect().bottom")
        share = header / viewport["height"]
        log_height = self.log.bounding_box()["height"]
        print(f"note    {self.size:7} the session header is {header:.0f} px of {viewport['height']} ({share:.1%}); the chat {log_height:.0f} px", flush=True)
        if self.size == "phone":
            assert share <= 0.15, f"the header takes {share:.1%} of the screen"
            assert log_height >= 0.55 * viewport["height"], f"the chat has {log_height} px"
            head = page.locator(".session-head").bounding_box()
            assert head["height"] <= 48, f"the title line is {head['height']} px tall"
        else:
            assert share <= 0.22, f"the header takes {share:.1%} of the screen"
        self.tap_targets()
        self.shot("compact-header")
        if self.size != "phone":
            return

        box = self.role("textbox", "Message")
        box.focus()
        page.set_viewport_size(PHONE_WITH_KEYBOARD)
        try:
            page.wait_for_function("() => document.documentElement.classList.contains('keyboard')")
            assert page.evaluate("visualViewport.height") == PHONE_WITH_KEYBOARD["height"]
            box.fill("typed with the keyboard open")
            height = PHONE_WITH_KEYBOARD["height"]
            composer = page.locator("#composer").bounding_box()
            message = box.bounding_box()
            send = self.role("button", "Send").bounding_box()
            assert message["y"] >= 0 and message["y"] + message["height"] <= height, f"the message box is at {message}"
            assert send["y"] + send["height"] <= height, f"Send is at {send}"
            assert composer["y"] + composer["height"] <= height + 1, f"the composer ends below the screen: {composer}"
            expect(page.locator(".topbar")).to_be_hidden()
            expect(self.role("tab", "Chat")).to_be_hidden()
            head = page.locator(".session-head").bounding_box()
            assert head["y"] >= 0 and head["height"] <= 48, f"the header is not one line: {head}"
            log = self.log.bounding_box()
            assert log["height"] >= 0.5 * height, f"the chat keeps {log['height']} of {height} px"
            self.no_horizontal_scroll()
            self.shot("keyboard-chat")
            box.fill("")
        finally:
            page.evaluate("() => document.activeElement?.blur()")
            page.set_viewport_size(PHONE)
        page.wait_for_function("() => !document.documentElement.classList.contains('keyboard')")
        expect(self.role("tab", "Chat")).to_be_visible()

        # The terminal: typing in it keeps the key bar above the keyboard.
        self.tab("Terminal")
        expect(self.terminal_status()).to_contain_text(re.compile("your shell|read-only"))
        region = page.get_by_role("region", name="Terminal", exact=True)
        region.click()
        page.set_viewport_size(PHONE_WITH_KEYBOARD)
        try:
            page.wait_for_function("() => document.documentElement.classList.contains('keyboard')")
            height = PHONE_WITH_KEYBOARD["height"]
            for name in ["Esc", "Tab", "Ctrl", "Ctrl-C", "Up", "Down", "Left", "Right"]:
                key = self.role("button", name)
                expect(key).to_be_visible()
                b = key.bounding_box()
                assert b["y"] >= 0 and b["y"] + b["height"] <= height, f"{name} is at {b}, the screen ends at {height}"
            term = region.bounding_box()
            assert term["height"] >= 150 and term["y"] + term["height"] <= height, f"the terminal is at {term}"
            self.shot("keyboard-terminal")
        finally:
            page.evaluate("() => document.activeElement?.blur()")
            page.set_viewport_size(PHONE)
        page.wait_for_function("() => !document.documentElement.classList.contains('keyboard')")
        self.tab("Chat")

    def prompt_answer_box(self):
        """A command that waits for input shows its question with an answer box; the answer goes
        to its stdin. A message typed in the message box meanwhile is not refused silently: it
        stays in the box, and "Send to the command" sends it there."""
        page = self.page
        self.tab("Chat")
        self.send("read -p 'name? ' n; echo \"hello $n\"")
        tool = self.tool("read -p").last
        expect(tool).to_have_class(re.compile(r"\btool-in_progress\b"))
        prompt = self.role("group", "Command input")
        expect(prompt).to_be_visible()
        expect(prompt).to_contain_text("name?")
        # Typed in the message box: not sent to the agent, which cannot take it; offered to the command.
        box = self.role("textbox", "Message")
        box.fill("typed in the message box")
        box.press("Enter")
        offer = self.role("group", "Message for the command")
        expect(offer).to_be_visible()
        expect(offer).to_contain_text("name?")
        expect(box).to_have_value("typed in the message box")
        expect(page.locator("#chat-error")).to_be_hidden()
        self.no_horizontal_scroll()
        self.tap_targets()
        self.shot("prompt")
        box.fill("")
        answer = self.role("textbox", "Answer")
        answer.fill(f"warren-{self.size}")
        answer.press("Enter")
        expect(self.agent_text(f"hello warren-{self.size}")).to_have_count(1)
        expect(prompt).to_be_hidden()
        expect(offer).to_be_hidden()
        self.wait_tool_done("read -p")
        expect(tool).to_have_class(re.compile(r"\btool-completed\b"))

        # A command that reads without a prompt: the message box's text goes to it by the offer.
        self.send("read -r line; echo \"got [$line]\"")
        expect(self.tool("read -r line").last).to_have_class(re.compile(r"\btool-in_progress\b"))
        n_problems = len(self.problems)
        box.fill("from the message box")
        self.role("button", "Send").click()
        expect(offer).to_be_visible()
        # Sent within a second of the command's start, the message is asked of the gateway, which
        # refuses it (409 TURN_IN_PROGRESS, logged by the browser) while the turn runs: offered all the same.
        self.problems[n_problems:] = [p for p in self.problems[n_problems:] if not re.search(r"status of 409 \(Conflict\) \(.*/messages\)", p)]
        self.role("button", "Send to the command").click()
        expect(self.agent_text("got [from the message box]")).to_have_count(1)
        expect(box).to_have_value("")
        expect(offer).to_be_hidden()
        self.wait_tool_done("read -r line")
        # A command that prints its question (on pipes, as python's input() does) and a password.
        self.send("printf 'Password: '; read -r p; echo \"${#p} characters\"")
        expect(prompt).to_contain_text("Password:")
        expect(answer).to_have_attribute("type", "password")
        answer.fill("hunter22")
        self.role("button", "Send answer").click()
        expect(self.agent_text("Password: 8 characters")).to_have_count(1)
        expect(prompt).to_be_hidden()
        self.wait_tool_done("printf 'Password: '")

    def file_viewer(self):
        """Tapping a text file opens it read-only: line numbers, monospace, soft wrap on and
        off, colours by its extension (highlight.js, loaded only then); a binary file says so;
        a file over 1 MiB shows its first MiB and says so; each has a Download link. Back (or
        Close file) returns to the folder."""
        page = self.page
        python = (
            "# A greeting.\n"
            "def greet(name):\n"
            '    """Say hello."""\n'
            f'    return f"hello {{name}}"  # {"and a long comment " * 8}\n'
            "\n"
            "print(greet('phone'))\n"
        ).encode()
        rust = b'/// The entry point.\nfn main() {\n    let who = "world";\n    println!("hello {who}");\n}\n'
        big = b"".join(b"line %06d of the log, to make it long\n" % n for n in range(40_000))
        line_bytes = len(big) // 40_000
        # The first MiB: its whole lines and the start of the next.
        n_shown, cut = divmod(1024 * 1024, line_bytes)
        n_shown += 1 if cut else 0
        assert len(big) > 1024 * 1024
        self.put_file("viewer/hello.py", python)
        self.put_file("viewer/main.rs", rust)
        self.put_file("viewer/blob.bin", bytes(range(256)) * 4)
        self.put_file("viewer/big.log", big)
        self.put_file("viewer/empty.txt", b"")
        loaded_highlight = "() => performance.getEntriesByType('resource').filter((e) => e.name.includes('/vendor/highlight/')).map((e) => new URL(e.name).pathname)"
        page.reload()  # a fresh page: what loads with it, and what only with a file
        self.tab("Files")
        files = self.role("list", "Files")
        files.get_by_role("button", name="viewer/", exact=True).click()
        expect(files.get_by_role("listitem", name="big.log", exact=True)).to_be_visible()
        assert page.evaluate(loaded_highlight) == [], "highlight.js loaded with the page"

        viewer = self.role("region", "File viewer")
        content = self.role("region", "File content")
        files.get_by_role("button", name="View hello.py", exact=True).click()
        expect(viewer).to_be_visible()
        expect(files).to_be_hidden()
        expect(content.locator("pre.code.hljs")).to_have_count(1)
        lines = content.locator(".code-line")
        expect(lines).to_have_count(6)
        assert lines.evaluate_all("ls => ls.map((l) => l.dataset.line)") == ["1", "2", "3", "4", "5", "6"]
        number = lines.nth(1).evaluate("l => [getComputedStyle(l, '::before').content, parseFloat(getComputedStyle(l).paddingLeft)]")
        assert number[0] == '"2"' and number[1] > 16, f"no line number 2 in the gutter: {number}"
        assert lines.nth(1).text_content() == "def greet(name):", lines.nth(1).text_content()
        keyword = content.locator(".hljs-keyword").first
        expect(keyword).to_have_text("def")
        expect(content.locator(".hljs-string").first).to_contain_text("Say hello")
        expect(content.locator(".hljs-comment").first).to_have_text("# A greeting.")
        # The viewer may lay its blocks out again meanwhile: a replaced (detached) node has no
        # computed style, so the current keyword is read until it is attached (bounded).
        deadline = time.monotonic() + 5
        while True:
            colours = keyword.evaluate("k => k.isConnected ? [getComputedStyle(k).color, getComputedStyle(k.closest('pre')).color, getComputedStyle(k).fontFamily] : null")
            if colours is not None or time.monotonic() > deadline:
                break
            self.page.wait_for_timeout(50)
        assert colours is not None, "the keyword stayed detached"
        assert colours[0] != colours[1], f"the keyword has the text's colour: {colours}"
        assert "monospace" in colours[2], colours
        loaded = page.evaluate(loaded_highlight)
        assert "/console/vendor/highlight/core.min.js" in loaded and "/console/vendor/highlight/languages/python.min.js" in loaded, loaded
        # Soft wrap: off, the long line scrolls in its box; on, it wraps.
        wrap = self.role("button", "Wrap")
        body_width = "b => [b.scrollWidth, b.clientWidth]"
        if wrap.get_attribute("aria-pressed") == "true":
            wrap.click()
        expect(wrap).to_have_attribute("aria-pressed", "false")
        scroll, width = content.evaluate(body_width)
        assert scroll > width, f"the long line does not run past the box: {scroll} <= {width}"
        wrap.click()
        expect(wrap).to_have_attribute("aria-pressed", "true")
        scroll, width = content.evaluate(body_width)
        assert scroll <= width, f"wrapped, the content is still {scroll} px wide in {width}"
        download = viewer.get_by_role("link", name="Download hello.py", exact=True)
        expect(download).to_be_visible()
        expect(download).to_have_attribute("download", "hello.py")
        assert "file=viewer%2Fhello.py" in page.url, page.url
        self.no_horizontal_scroll()
        self.tap_targets()
        self.shot("file-viewer-py")
        wrap.click()
        # Back closes the file.
        page.go_back()
        expect(viewer).to_be_hidden()
        expect(files.get_by_role("listitem", name="hello.py", exact=True)).to_be_visible()

        files.get_by_role("button", name="View main.rs", exact=True).click()
        expect(content.locator("pre.code.hljs")).to_have_count(1)
        expect(content.locator(".code-line")).to_have_count(5)
        expect(content.locator(".hljs-keyword").first).to_have_text("fn")
        expect(content.locator(".hljs-string").first).to_have_text('"world"')
        expect(content.locator(".hljs-comment").first).to_have_text("/// The entry point.")
        assert "/console/vendor/highlight/languages/rust.min.js" in page.evaluate(loaded_highlight)
        self.shot("file-viewer-rs")
        page.emulate_media(color_scheme="dark")
        try:
            self.shot("file-viewer-rs-dark")
        finally:
            page.emulate_media(color_scheme="light")
        self.role("button", "Close file").click()
        expect(viewer).to_be_hidden()
        expect(files).to_be_visible()

        files.get_by_role("button", name="View blob.bin", exact=True).click()
        note = viewer.get_by_role("status")
        expect(note).to_have_text("Binary file, 1,024 bytes: download it to open it.")
        expect(content.locator("pre")).to_have_count(0)
        expect(viewer.get_by_role("link", name="Download blob.bin", exact=True)).to_be_visible()
        self.shot("file-viewer-binary")
        self.role("button", "Close file").click()

        files.get_by_role("button", name="View empty.txt", exact=True).click()
        expect(note).to_have_text("Empty file.")
        expect(content).to_be_hidden()
        self.role("button", "Close file").click()

        started = time.monotonic()
        files.get_by_role("button", name="View big.log", exact=True).click()
        expect(note).to_have_text("Showing the first 1.0 MiB of 1.5 MiB: download it for the rest.")
        expect(content).not_to_have_attribute("aria-busy", "true")
        shown = content.locator(".code-line").count()
        assert shown == n_shown, f"{shown} lines of the first MiB, not {n_shown}"
        last = content.locator(".code-line").last.text_content()
        assert (b"line %06d" % (n_shown - 1)).decode().startswith(last[:11]) and len(last) == (cut or line_bytes - 1), repr(last)
        took = time.monotonic() - started
        assert took < 10, f"the first MiB took {took:.1f} s to show"
        expect(content.locator("pre.code.hljs")).to_have_count(0)
        print(f"note    {self.size:7} the viewer showed a 1 MiB log in {took:.1f} s", flush=True)
        self.shot("file-viewer-truncated")
        self.role("button", "Close file").click()
        expect(files).to_be_visible()
        self.role("button", "Parent folder").click()
        expect(files.get_by_role("listitem", name="viewer", exact=True)).to_be_visible()
        self.tab("Chat")
