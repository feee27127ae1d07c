"""Browser flows of checkpoints (checkpoints.md): a turn's "N files changed" and its diff, the
Checkpoints view, a checkpoint's files, Rewind and Fork.

A mixin of run.py's `Run`: each method is one flow, named in `Run.FLOWS`, and uses Run's
helpers (`self.page`, `self.role`, `self.shot`, `self.api`, ...). The workspace is changed by
the built-in shell agent (each message is a command); what a rewind or a fork left is read back
through the live files route, not through the page.
"""

import re
import time
import urllib.error
import urllib.request
from urllib.parse import quote

from playwright.sync_api import expect

# What the browser logs for the rewind the gateway refuses on purpose while a turn runs.
TURN_RUNNING = re.compile(r"status of 409 \(Conflict\)")


class CheckpointFlows:
    # ---- helpers ----

    def _file_text(self, session_id, path):
        """The content of `path` in a session's workspace now (`GET /files/content`), or None
        when there is no such file."""
        token = self.page.evaluate("localStorage.getItem('warren.token')")
        request = urllib.request.Request(
            f"{self.origin}/v1/sessions/{session_id}/files/content?path={quote(path)}",
            headers={"Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read().decode()
        except urllib.error.HTTPError as error:
            assert error.code == 404, f"GET {path}: {error.code} {error.read()[:200]!r}"
            return None

    def _turn(self, command):
        """Runs `command` as one turn and waits until it is over and its "N files changed" is in
        the chat; the session's turn number and that button."""
        lines = self.log.locator(".checkpoint-line")
        self.api().wait_idle(self.session_id)
        n_lines = lines.count()
        self.send(command)
        self.wait_tool_done(command[:20])
        turn = self.api().wait_idle(self.session_id)["turn"]
        expect(lines).to_have_count(n_lines + 1)
        return turn, self._changes_button()

    def _changes_button(self):
        """The last turn's "N files changed" in the chat."""
        return self.log.locator(".checkpoint-line").last.get_by_role("button", name=re.compile(r"^\d+ files? changed$"))

    def _wait_running(self, session_id, timeout_s=20):
        deadline = time.monotonic() + timeout_s
        while self.api().call("GET", f"/v1/sessions/{session_id}")[1]["status"] != "running":
            assert time.monotonic() < deadline, f"session {session_id} did not start its turn in {timeout_s} s"
            time.sleep(0.1)

    def _checkpoint_item(self, turn):
        """The Checkpoints list's entry of `turn`'s own checkpoint."""
        entries = self.role("list", "Checkpoints").get_by_role("listitem")
        return entries.filter(has=self.page.get_by_text(re.compile(rf"^Turn {turn}$"))).filter(has_not_text="before a rewind")

    def _back_to_chat(self):
        """Back from a checkpoint's changes to the chat they were opened from."""
        self.page.go_back()
        expect(self.role("tab", "Chat")).to_have_attribute("aria-selected", "true")
        expect(self.log).to_be_visible()

    # ---- flows ----

    def checkpoints_diff_rewind_fork(self):
        """A turn that changes files ends with "N files changed", which opens its diff (added
        files, a modified file's lines in colour) and survives a reload; the Checkpoints view
        lists the turns' checkpoints newest first and browses a checkpoint's files; Rewind asks
        first, says plainly that a running turn stops it, and then puts the first turn's files
        back; Fork makes a new session whose files are the checkpoint's, and its first line
        links back to this session."""
        page = self.page
        sid = self.session_id
        self.tab("Chat")
        forks = []
        try:
            # A checkpoint of what earlier flows left (uploads, made outside turns, are in the
            # next one), so that the turns below are compared with exactly what they found.
            self._turn("mkdir -p cp-flow && date > cp-flow/start.txt")
            # Turn 1: two new files.
            first, changes = self._turn("mkdir -p cp-flow && printf 'first\\n' > cp-flow/a.txt && printf 'keep\\n' > cp-flow/b.txt")
            expect(changes).to_have_text("2 files changed")
            self.no_horizontal_scroll()
            self.shot("checkpoint-chat")
            changes.click()
            assert "view=checkpoints" in page.url and "show=diff" in page.url, page.url
            diff = self.role("region", "Changes")
            expect(diff).to_contain_text("2 files changed: 2 added")
            files = diff.get_by_role("list", name="Changed files", exact=True).get_by_role("listitem")
            expect(files).to_have_count(2)
            expect(files.nth(0)).to_contain_text("Added")
            expect(files.nth(0)).to_contain_text("cp-flow/a.txt")
            expect(files.nth(1)).to_contain_text("cp-flow/b.txt")
            self.no_horizontal_scroll()
            self.tap_targets()
            self.shot("checkpoint-diff-added")
            self._back_to_chat()

            # Turn 2: a file modified, one added.
            second, changes = self._turn("printf 'second\\n' > cp-flow/a.txt && printf 'new\\n' > cp-flow/c.txt")
            assert second > first, (first, second)
            expect(changes).to_have_text("2 files changed")
            # Replayed from the start after a reload: the same lines, once each.
            n_lines = self.log.locator(".checkpoint-line").count()
            page.reload()
            expect(self.log.locator(".checkpoint-line")).to_have_count(n_lines)
            self._changes_button().click()
            modified = self.role("region", "Changes").get_by_role("listitem").filter(has_text="cp-flow/a.txt")
            expect(modified).to_contain_text("Modified")
            expect(modified).to_contain_text("+1 −1")
            expect(modified.locator("pre.diff .del")).to_have_text("-first")
            expect(modified.locator("pre.diff .add")).to_have_text("+second")
            colours = modified.locator("pre.diff").evaluate(
                "pre => ['.add', '.del'].map((c) => getComputedStyle(pre.querySelector(c)).backgroundColor)"
            )
            assert colours[0] != colours[1] and "rgba(0, 0, 0, 0)" not in colours, colours
            self.no_horizontal_scroll()
            self.shot("checkpoint-diff")
            self._back_to_chat()

            # The Checkpoints view: both turns, newest first.
            self.tab("Checkpoints")
            assert f"session={sid}" in page.url and "view=checkpoints" in page.url, page.url
            entries = self.role("list", "Checkpoints").get_by_role("listitem")
            expect(self._checkpoint_item(second)).to_have_count(1)
            expect(self._checkpoint_item(first)).to_have_count(1)
            titles = entries.locator(".checkpoint-head strong").all_text_contents()
            assert titles.index(f"Turn {second}") < titles.index(f"Turn {first}"), titles
            expect(self._checkpoint_item(second)).to_contain_text("2 changed")
            self.no_horizontal_scroll()
            self.tap_targets()
            self.shot("checkpoints")

            # Its files as a .tar.zst: the link downloads the export (a zstd frame).
            download_link = self._checkpoint_item(first).get_by_role("link", name=f"Download the files of turn {first}", exact=True)
            expect(download_link).to_have_attribute("download", "")
            href = download_link.get_attribute("href")
            assert "/export?access_token=" in href, href
            exported = page.request.get(self.origin + href)
            assert exported.status == 200 and exported.headers["content-type"] == "application/zstd", (exported.status, exported.headers)
            assert exported.body()[:4] == b"\x28\xb5\x2f\xfd", exported.body()[:4]

            # The first turn's files, as they were: a.txt still says "first".
            self._checkpoint_item(first).get_by_role("button", name="Browse files", exact=True).click()
            expect(page.get_by_role("heading", name=f"Files as of turn {first}", exact=True)).to_be_visible()
            listing = self.role("list", "Files of the checkpoint")
            listing.get_by_role("button", name="cp-flow/", exact=True).click()
            expect(listing.get_by_role("listitem", name="b.txt", exact=True)).to_be_visible()
            expect(listing.get_by_role("listitem", name="c.txt", exact=True)).to_have_count(0)
            listing.get_by_role("button", name="View a.txt", exact=True).click()
            expect(self.role("region", "File content").locator(".code-line")).to_have_text(["first"])
            self.no_horizontal_scroll()
            self.shot("checkpoint-file")
            page.go_back()  # the file
            page.go_back()  # the folder
            page.go_back()  # the checkpoint's files
            expect(self.role("list", "Checkpoints")).to_be_visible()

            # Rewind while a turn runs: refused, said in the dialog, nothing changed.
            item = self._checkpoint_item(first)
            self.api().message(sid, "sleep 30")
            self.n_user_messages += 1
            self._wait_running(sid)
            item.get_by_role("button", name="Rewind", exact=True).click()
            dialog = page.get_by_role("dialog", name=f"Rewind to turn {first}?", exact=True)
            expect(dialog).to_be_visible()
            expect(dialog).to_contain_text("The workspace becomes what it was at this checkpoint")
            expect(dialog).to_contain_text("current state is kept as a checkpoint first")
            expect(dialog.get_by_role("button", name="Cancel", exact=True)).to_be_focused()
            self._dialog_fits(dialog)
            self.shot("rewind-confirm")
            n_problems = len(self.problems)
            dialog.get_by_role("button", name="Rewind", exact=True).click()
            expect(dialog.get_by_role("alert")).to_have_text("The agent is working on a turn: wait until it ends (or Cancel it in the Chat), then rewind.")
            self._forgive(n_problems, TURN_RUNNING)
            self.shot("rewind-turn-running")
            assert self._file_text(sid, "cp-flow/a.txt") == "second\n", "a refused rewind changes nothing"
            status, _ = self.api().call("POST", f"/v1/sessions/{sid}/cancel")
            assert status == 202, status
            self.api().wait_idle(sid)
            # A file made since the last checkpoint, outside any turn.
            self.put_file("cp-flow/d.txt", b"uploaded\n")

            # Now it rewinds: the first turn's files are back, the second turn's and the upload
            # gone.
            dialog.get_by_role("button", name="Rewind", exact=True).click()
            expect(dialog).to_be_hidden()
            expect(page.locator("#checkpoints-note")).to_contain_text(f"Rewound to turn {first}")
            files = {path: self._file_text(sid, path) for path in ["cp-flow/a.txt", "cp-flow/b.txt", "cp-flow/c.txt", "cp-flow/d.txt"]}
            assert files == {"cp-flow/a.txt": "first\n", "cp-flow/b.txt": "keep\n", "cp-flow/c.txt": None, "cp-flow/d.txt": None}, files
            # What the workspace held before is the newest checkpoint: the upload is in it.
            expect(entries.first).to_contain_text("before a rewind")
            expect(entries.first).to_contain_text("1 changed")
            self.no_horizontal_scroll()
            self.shot("rewound")
            # The chat says it too, on every device: what the rewind kept, and the rewind.
            self.tab("Chat")
            expect(self.log.locator(".checkpoint-line").last).to_have_text("Before the rewind · 1 file changed")
            expect(self.log.locator(".note.rewound").last).to_have_text(f"Workspace rewound to turn {first}; what it held before is kept as a checkpoint.")
            self.shot("rewound-chat")
            self.tab("Checkpoints")

            # Fork the second turn's checkpoint: a new session with its files.
            fork_title = f"{self.size} fork of turn {second}"
            self._checkpoint_item(second).get_by_role("button", name="Fork", exact=True).click()
            dialog = page.get_by_role("dialog", name=f"Fork from turn {second}?", exact=True)
            box = dialog.get_by_role("textbox", name="Title of the new session", exact=True)
            expect(box).to_be_focused()
            expect(box).to_have_value(f"{self.title} (turn {second})")
            self._dialog_fits(dialog)
            self.shot("fork-confirm")
            box.fill(fork_title)
            box.press("Enter")
            expect(dialog).to_be_hidden()
            expect(page.get_by_role("heading", name=fork_title, exact=True)).to_be_visible()
            fork_id = re.search(r"session=([^&]+)", page.url).group(1)
            forks.append(fork_id)
            assert fork_id != sid, page.url
            line = self.log.locator(".note.forked")
            expect(line).to_contain_text(f"Forked from {self.title} at checkpoint")
            self.no_horizontal_scroll()
            self.shot("forked")
            # Its sandbox starts with the checkpoint's files: its agent reads them, and so does
            # the files route once the sandbox runs.
            self.send("cat cp-flow/a.txt cp-flow/c.txt")
            self.n_user_messages -= 1  # this session's count is the source's
            expect(self.log.locator(".msg.agent").filter(has_text=re.compile(r"^second\s*new$"))).to_have_count(1)
            self.wait_tool_done("cat cp-flow/a.txt")
            files = {path: self._file_text(fork_id, path) for path in ["cp-flow/a.txt", "cp-flow/b.txt", "cp-flow/c.txt", "cp-flow/d.txt"]}
            assert files == {"cp-flow/a.txt": "second\n", "cp-flow/b.txt": "keep\n", "cp-flow/c.txt": "new\n", "cp-flow/d.txt": None}, files
            assert self._file_text(sid, "cp-flow/a.txt") == "first\n", "the source stays rewound"

            # Its first line leads back to this session.
            line.get_by_role("link", name=self.title, exact=True).click()
            expect(page.get_by_role("heading", name=self.title, exact=True)).to_be_visible()
            assert f"session={sid}" in page.url, page.url
            self.tab("Chat")
        finally:
            self._close_dialogs()
            self.api().call("POST", f"/v1/sessions/{sid}/cancel")
            for fork_id in forks:
                self.api().call("DELETE", f"/v1/sessions/{fork_id}")
