"""Browser flows of the phone app: pairing a second device, the device list, sign-out, push notifications.

A mixin of run.py's `Run`: each method is one flow, named in `Run.FLOWS`, and uses Run's
helpers (`self.page`, `self.role`, `self.shot`, `self.api`, ...).

Other browsers are other contexts of the same Chromium at the same size (no storage shared).
A device these flows add is revoked before the flow ends, so the main page's device list holds
only what the flow under test made. A push cannot come from a push service here (headless
Chromium has none): the flows deliver the gateway's payload to the service worker through the
DevTools protocol (`ServiceWorker.deliverPushMessage`) and click its notification by
dispatching the worker's `notificationclick`, and check what the browser shows with
`registration.getNotifications()`.
"""

import base64
import json
import re
import sys
import time

from playwright.sync_api import expect

# Browser-made console errors of requests refused on purpose: a used pairing code, a revoked
# or signed-out token (its event stream, its next call).
UNAUTHORIZED = re.compile(r"status of 401 \(Unauthorized\)")
# What Chromium logs when a page subscribes off the record (every Playwright context is).
NO_PUSH_OFF_THE_RECORD = re.compile(r"does not support the Push API in incognito mode")

READ_WORKER_TOKEN = """() => new Promise((resolve) => {
    const open = indexedDB.open('warren-worker', 1);
    open.onupgradeneeded = () => open.result.createObjectStore('secrets');
    open.onerror = () => resolve('cannot open');
    open.onsuccess = () => {
        const db = open.result;
        const get = db.transaction('secrets').objectStore('secrets').get('token');
        get.onsuccess = () => { db.close(); resolve(get.result ?? null); };
        get.onerror = () => { db.close(); resolve('cannot read'); };
    };
})"""

NOTIFICATIONS = """(tag) => navigator.serviceWorker.ready
    .then((registration) => registration.getNotifications(tag ? { tag } : {}))
    .then((shown) => shown.map((n) => ({
        title: n.title, body: n.body, tag: n.tag, data: n.data,
        actions: n.actions.map((a) => [a.action, a.title]),
        requireInteraction: n.requireInteraction, renotify: n.renotify,
    })))"""

CLICK_NOTIFICATION = """async ([tag, action]) => {
    const [notification] = await self.registration.getNotifications({ tag });
    if (!notification) return `no notification tagged ${tag}`;
    self.dispatchEvent(new NotificationEvent('notificationclick', { notification, action }));
    return 'clicked';
}"""


class DeviceFlows:
    # ---- helpers ----

    def _run(self):
        """run.py's module (SIZES, TIMEOUT_MS, Gateway): it runs as `__main__`."""
        return sys.modules[type(self).__module__]

    def _new_context(self):
        run = self._run()
        context = self.browser.new_context(**run.SIZES[self.size])
        context.set_default_timeout(run.TIMEOUT_MS)
        return context

    def _gateway(self, token=None):
        return self._run().Gateway(self.origin, token)

    def _shot_of(self, page, view):
        page.screenshot(path=str(self.shots / f"{self.size}-{view}.png"))

    def _forgive(self, since, pattern=UNAUTHORIZED):
        """Drops the console errors matching `pattern` logged since problem `since`."""
        self.problems[since:] = [p for p in self.problems[since:] if not pattern.search(p)]

    def _device_ids(self):
        status, body = self.api().call("GET", "/v1/devices")
        assert status == 200, (status, body)
        return body["devices"]

    def _this_device(self):
        return next(d["device_id"] for d in self._device_ids() if d["current"])

    def _paired_device(self, name):
        """A device of the main page's owner, paired through the API: `(device_id, token)`."""
        status, pair = self.api().call("POST", "/v1/devices/pair")
        assert status == 201, (status, pair)
        device_id = f"{name}-{self.size}-{int(time.time() * 1000) % 10**9}"
        status, registered = self._gateway().call("POST", "/v1/devices", {"device_id": device_id, "pair_code": pair["code"]})
        assert status == 201, (status, registered)
        return device_id, registered["token"]

    def _revoke(self, device_ids):
        for device_id in device_ids:
            status, body = self.api().call("DELETE", f"/v1/devices/{device_id}")
            assert status in (204, 404), (device_id, status, body)

    def _signed_in_page(self, context, token):
        """A page of `context` signed in with `token` through the "Device token" form."""
        page = self.watch(context.new_page())
        page.goto(self.origin + "/")
        page.get_by_role("textbox", name="Device token", exact=True).fill(token)
        page.get_by_role("button", name="Sign in", exact=True).click()
        expect(page.get_by_role("button", name="Account", exact=True)).to_be_visible()
        return page

    def _open_account(self, page=None):
        page = page or self.page
        page.get_by_role("button", name="Account", exact=True).click()
        dialog = page.get_by_role("dialog", name="Account", exact=True)
        expect(dialog).to_be_visible()
        return dialog

    def _close_dialogs(self, page=None):
        (page or self.page).evaluate("document.querySelectorAll('dialog[open]').forEach((d) => d.close())")

    def _dialog_fits(self, dialog):
        """A dialog never scrolls sideways (the page's own check does not see the top layer)."""
        widths = dialog.evaluate("d => [d.scrollWidth, d.clientWidth, d.getBoundingClientRect().right, window.innerWidth]")
        assert widths[0] <= widths[1] and widths[2] <= widths[3], f"the dialog is too wide: {widths}"

    def _worker_token(self, page, want, timeout_s=10):
        """Waits until the token the page keeps for the service worker is `want`."""
        deadline = time.monotonic() + timeout_s
        while True:
            token = page.evaluate(READ_WORKER_TOKEN)
            if token == want or time.monotonic() > deadline:
                assert token == want, f"the worker's token is {token!r}, not {want!r}"
                return
            page.wait_for_timeout(100)

    def _notifications(self, tag, until, timeout_s=15):
        """The notifications tagged `tag` once `until(notifications)` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            shown = self.page.evaluate(NOTIFICATIONS, tag)
            if until(shown):
                return shown
            assert time.monotonic() < deadline, f"notifications tagged {tag}: {shown}; all of them: {self.page.evaluate(NOTIFICATIONS, '')}"
            self.page.wait_for_timeout(100)

    def _service_worker(self):
        url = self.origin + "/sw.js"
        workers = [w for w in self.context.service_workers if w.url == url]
        if workers:
            return workers[-1]
        return self.context.wait_for_event("serviceworker", predicate=lambda w: w.url == url)

    def _push_to(self, cdp, registration_id, payload):
        cdp.send("ServiceWorker.deliverPushMessage", {"origin": self.origin, "registrationId": registration_id, "data": json.dumps(payload)})

    def _pushed_and_shown(self, cdp, registration_id, payload, tag):
        """Delivers `payload` as a push and returns the one notification tagged `tag` it shows.
        DevTools' `deliverPushMessage` answers before the worker ran and says nothing of a
        message it did not deliver (rarely here, nothing was shown within 15 s while every other
        step worked); a real push service delivers again, and so does this, once, when nothing
        shows within 5 s, and says so."""
        self._push_to(cdp, registration_id, payload)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            shown = self.page.evaluate(NOTIFICATIONS, tag)
            if len(shown) == 1:
                return shown
            self.page.wait_for_timeout(100)
        print(f"push tagged {tag} showed nothing within 5 s; delivered again", flush=True)
        self._push_to(cdp, registration_id, payload)
        return self._notifications(tag, lambda n: len(n) == 1)

    def _registration_id(self, cdp):
        """The console's service worker registration, as the DevTools protocol names it."""
        registrations = []
        cdp.on("ServiceWorker.workerRegistrationUpdated", lambda event: registrations.extend(event["registrations"]))
        cdp.send("ServiceWorker.enable")
        deadline = time.monotonic() + 10
        while True:
            mine = [r for r in registrations if r["scopeURL"] == self.origin + "/" and not r["isDeleted"]]
            if mine:
                return mine[-1]["registrationId"]
            assert time.monotonic() < deadline, f"no service worker registration for {self.origin}/: {registrations}"
            self.page.wait_for_timeout(100)

    def _pending_request(self, command):
        """Sends `command` (the shell agent asks before an `rm`) once the last turn ended, and
        returns its request group and id."""
        self.api().wait_idle(self.session_id)
        self.send(command)
        group = self.page.get_by_role("group", name="Permission request", exact=True).last
        expect(group).to_contain_text(command)
        expect(group.get_by_role("button", name="Run it", exact=True)).to_be_visible()
        return group, group.get_by_role("button", name="Run it", exact=True).get_attribute("data-request-id")

    # ---- flows ----

    def pair_second_device(self):
        """phone.md "Pairing": the Account panel's code (QR, text, link, countdown) lets a second
        browser join; it sees and opens the same session. The code works once; a new code, typed
        loosely on the sign-in screen, works too."""
        page = self.page
        main_token = page.evaluate("localStorage.getItem('warren.token')")
        before = {d["device_id"] for d in self._device_ids()}
        contexts = []
        try:
            account = self._open_account()
            expect(account.get_by_role("heading", name="Pair another device", exact=True)).to_be_visible()
            account.get_by_role("button", name="Pair another device", exact=True).click()
            code_text = account.get_by_label("Pairing code", exact=True)
            expect(code_text).to_have_text(re.compile(r"^[A-Z2-9]{4}-[A-Z2-9]{4}$"))
            code = code_text.text_content()
            link = account.locator("#pair-url")
            expect(link).to_have_text(f"{self.origin}/#/pair/{code}")
            url = link.text_content()
            qr = account.get_by_role("img", name="QR code of the pairing link", exact=True)
            expect(qr).to_be_visible()
            page.wait_for_function("() => document.getElementById('pair-qr').complete")
            src, width = qr.evaluate("img => [img.getAttribute('src'), img.naturalWidth]")
            assert src.startswith("data:image/svg+xml;base64,") and width > 0, (src[:40], width)
            svg = base64.b64decode(src.split(",", 1)[1]).decode()
            assert svg.lstrip().startswith(("<svg", "<?xml")), svg[:80]
            countdown = account.get_by_role("timer", name="Pairing code expiry", exact=True)
            expect(countdown).to_have_text(re.compile(r"^Expires in [45]:[0-5]\d$"))
            first = countdown.text_content()
            expect(countdown).not_to_have_text(first, timeout=3000)  # it counts down
            self._dialog_fits(account)
            self.tap_targets()
            self.shot("account-pairing")

            # The second browser opens the link: the code is filled in, Join is the next step.
            context = self._new_context()
            contexts.append(context)
            second = self.watch(context.new_page())
            second.goto(url)
            expect(second.get_by_role("textbox", name="Pairing code", exact=True)).to_have_value(code)
            join = second.get_by_role("button", name="Join", exact=True)
            expect(join).to_be_focused()
            self._shot_of(second, "pair-join")
            join.click()
            sessions = second.get_by_role("list", name="Sessions", exact=True)
            item = sessions.get_by_role("button", name=self.title, exact=True)
            expect(item).to_be_visible()
            token = second.evaluate("localStorage.getItem('warren.token')")
            assert token and token.startswith("wr_") and token != main_token, token
            assert "/pair/" not in second.url, second.url
            item.click()
            expect(second.get_by_role("heading", name=self.title, exact=True)).to_be_visible()
            # It drives the session: its message and the agent's answer reach the first browser.
            conversation = second.get_by_role("log", name="Conversation", exact=True)
            expect(conversation.locator(".msg.user")).to_have_count(self.n_user_messages)
            box = second.get_by_role("textbox", name="Message", exact=True)
            box.fill("echo from-the-paired-browser")
            box.press("Enter")
            self.n_user_messages += 1
            expect(conversation.locator(".msg.agent").filter(has_text=re.compile("^from-the-paired-browser$"))).to_have_count(1)
            # The first browser's panel, open all along, says who joined; the code is spent.
            second_id = next(d["device_id"] for d in self._gateway(token).call("GET", "/v1/devices")[1]["devices"] if d["current"])
            joined = account.locator("#pair-joined")
            expect(joined).to_have_text(f"{second_id} joined: it sees your sessions now. A code works once; make a new one for another device.")
            expect(countdown).to_be_hidden()
            self.shot("account-paired")
            account.get_by_role("button", name="Close", exact=True).click()
            self.tab("Chat")
            expect(self.agent_text("from-the-paired-browser")).to_have_count(1)
            # Opened again, the panel has forgotten the spent code.
            account = self._open_account()
            expect(account.locator("#pairing")).to_be_hidden()
            expect(account.get_by_role("button", name="Pair another device", exact=True)).to_be_visible()
            status, listed = self._gateway(token).call("GET", "/v1/sessions")
            assert status == 200 and any(s["id"] == self.session_id for s in listed["sessions"]), (status, listed)

            # The same code a second time: refused, said on the sign-in screen.
            n_problems = len(self.problems)
            context = self._new_context()
            contexts.append(context)
            third = self.watch(context.new_page())
            third.goto(url)
            third.get_by_role("button", name="Join", exact=True).click()
            expect(third.locator("#join-error")).to_contain_text("wrong, used or expired")
            expect(third.get_by_role("textbox", name="App key", exact=True)).to_be_visible()
            assert third.evaluate("localStorage.getItem('warren.token')") is None
            status, body = self._gateway().call("POST", "/v1/devices", {"device_id": f"again-{self.size}-{int(time.time())}", "pair_code": code})
            assert status == 401 and body["code"] == "INVALID_PAIR_CODE", (status, body)
            self._forgive(n_problems)

            # A new code (and another one: "New code" replaces it), typed in lower case with a
            # blank for the dash, joins the third browser.
            account.get_by_role("button", name="Pair another device", exact=True).click()
            expect(code_text).not_to_have_text(code)
            expect(joined).to_be_hidden()
            replaced = code_text.text_content()
            account.get_by_role("button", name="New code", exact=True).click()
            expect(code_text).not_to_have_text(replaced)
            fresh = code_text.text_content()
            expect(countdown).to_have_text(re.compile(r"^Expires in [45]:[0-5]\d$"))
            third.get_by_role("textbox", name="Pairing code", exact=True).fill(fresh.lower().replace("-", " "))
            third.get_by_role("button", name="Join", exact=True).click()
            expect(third.get_by_role("list", name="Sessions", exact=True).get_by_role("button", name=self.title, exact=True)).to_be_visible()
            status, body = self._gateway().call("POST", "/v1/devices", {"device_id": f"replaced-{self.size}-{int(time.time())}", "pair_code": replaced})
            assert status == 401 and body["code"] == "INVALID_PAIR_CODE", ("a replaced code still works", status, body)
            third_token = third.evaluate("localStorage.getItem('warren.token')")
            third_id = next(d["device_id"] for d in self._gateway(third_token).call("GET", "/v1/devices")[1]["devices"] if d["current"])
            expect(joined).to_contain_text(f"{third_id} joined")
            account.get_by_role("button", name="Close", exact=True).click()
            expect(account).to_be_hidden()

            # A pairing link opened where the browser is signed in already: the code is left
            # for another browser, this one stays as it was.
            page.evaluate("(code) => { location.hash = `#/pair/${code}`; }", code)
            notice = page.get_by_role("dialog", name="This browser is signed in already", exact=True)
            expect(notice).to_contain_text(f"The pairing code {code} was not used")
            self._dialog_fits(notice)
            notice.get_by_role("button", name="OK", exact=True).click()
            expect(notice).to_be_hidden()
            assert "/pair/" not in page.url and page.evaluate("localStorage.getItem('warren.token')") == main_token
            self.role("list", "Sessions").get_by_role("button", name=self.title, exact=True).click()
            expect(self.log).to_be_visible()
        finally:
            self._close_dialogs()
            for context in contexts:
                context.close()
            self._revoke({d["device_id"] for d in self._device_ids()} - before)

    def devices_list_and_revoke(self):
        """The owner's devices are listed (this one marked); revoking another asks first, and
        that device's token stops working: its console's next call signs it out, saying so."""
        page = self.page
        me = self._this_device()
        device_id, token = self._paired_device("revokee")
        context = self._new_context()
        try:
            second = self._signed_in_page(context, token)
            account = self._open_account()
            expect(account.locator("#account-device")).to_have_text(me)
            devices = account.get_by_role("list", name="Devices", exact=True)
            mine = devices.get_by_role("listitem").filter(has_text=me)
            expect(mine).to_contain_text("this device")
            expect(mine.get_by_role("button")).to_have_count(0)  # this one signs out instead
            other = devices.get_by_role("listitem").filter(has_text=device_id)
            expect(other).to_contain_text("used just now")
            expect(devices.get_by_role("listitem").first).to_contain_text(me)
            self._dialog_fits(account)
            self.tap_targets()
            devices.scroll_into_view_if_needed()
            self.shot("account")

            other.get_by_role("button", name=f"Revoke {device_id}", exact=True).click()
            confirm = page.get_by_role("dialog", name=f"Revoke {device_id}?", exact=True)
            expect(confirm).to_be_visible()
            expect(confirm).to_contain_text("stops working at once")
            expect(confirm).to_contain_text("sessions stay")
            self._dialog_fits(confirm)
            self.shot("revoke-confirm")
            confirm.get_by_role("button", name="Revoke device", exact=True).click()
            expect(confirm).to_be_hidden()
            expect(other).to_have_count(0)
            expect(account).to_be_visible()
            status, body = self._gateway(token).call("GET", "/v1/sessions")
            assert status == 401, (status, body)
            status, _ = self.api().call("GET", "/v1/sessions")
            assert status == 200, status
            account.get_by_role("button", name="Close", exact=True).click()

            # The revoked browser's next call (a new session) is refused: it is signed out, and
            # its sign-in screen says why.
            n_problems = len(self.problems)
            if self.size == "phone" and second.get_by_role("button", name="Sessions", exact=True).is_visible():
                second.get_by_role("button", name="Sessions", exact=True).click()
            second.get_by_role("textbox", name="Session title", exact=True).fill("made after the revoke")
            second.get_by_role("button", name="New session", exact=True).click()
            expect(second.get_by_role("textbox", name="App key", exact=True)).to_be_visible()
            expect(second.locator("#signin-note")).to_contain_text("This browser was signed out")
            assert second.evaluate("localStorage.getItem('warren.token')") is None
            self._worker_token(second, None)
            self._shot_of(second, "revoked")
            self._forgive(n_problems)
            status, listed = self.api().call("GET", "/v1/sessions")
            assert all(s["title"] != "made after the revoke" for s in listed["sessions"]), listed
        finally:
            self._close_dialogs()
            context.close()
            self._revoke([device_id])

    def sign_out_asks_first(self):
        """Sign-out says what it costs before it happens: Cancel keeps the browser signed in;
        confirming revokes the device (the token no longer works anywhere) and forgets it here,
        the worker's copy included. The owner's other devices keep the sessions."""
        me = self._this_device()
        device_id, token = self._paired_device("leaver")
        contexts = [self._new_context(), self._new_context()]
        try:
            page = self._signed_in_page(contexts[0], token)
            self._worker_token(page, token)
            page.get_by_role("button", name="Sign out", exact=True).click()
            dialog = page.get_by_role("dialog", name="Sign out of this browser?", exact=True)
            expect(dialog).to_be_visible()
            expect(dialog).to_contain_text("forgets its token")
            expect(dialog).to_contain_text("revokes this device")
            expect(dialog).to_contain_text(f"stay with your other device ({me})")
            expect(dialog.get_by_role("button", name="Cancel", exact=True)).to_be_focused()
            self._dialog_fits(dialog)
            self._shot_of(page, "signout-confirm")

            dialog.get_by_role("button", name="Cancel", exact=True).click()
            expect(dialog).to_be_hidden()
            expect(page.get_by_role("button", name="Sign out", exact=True)).to_be_visible()
            assert page.evaluate("localStorage.getItem('warren.token')") == token
            status, _ = self._gateway(token).call("GET", "/v1/sessions")
            assert status == 200, status

            n_problems = len(self.problems)
            page.get_by_role("button", name="Sign out", exact=True).click()
            dialog.get_by_role("button", name="Sign out and revoke", exact=True).click()
            expect(page.get_by_role("textbox", name="App key", exact=True)).to_be_visible()
            expect(page.locator("#signin-note")).to_be_hidden()
            assert page.evaluate("localStorage.getItem('warren.token')") is None
            self._worker_token(page, None)
            status, body = self._gateway(token).call("GET", "/v1/sessions")
            assert status == 401, (status, body)
            assert device_id not in {d["device_id"] for d in self._device_ids()}
            status, _ = self.api().call("GET", "/v1/sessions")
            assert status == 200, status
            self._forgive(n_problems)

            # A device alone with its sessions is told that signing out loses them.
            status, registered = self._gateway().call("POST", "/v1/devices", {"device_id": f"alone-{self.size}-{int(time.time())}"}, {"X-App-Key": self.args.app_key})
            assert status == 201, (status, registered)
            alone = self._signed_in_page(contexts[1], registered["token"])
            alone.get_by_role("button", name="Sign out", exact=True).click()
            lonely = alone.get_by_role("dialog", name="Sign out of this browser?", exact=True)
            expect(lonely).to_contain_text("only device")
            n_problems = len(self.problems)
            lonely.get_by_role("button", name="Sign out and revoke", exact=True).click()
            expect(alone.get_by_role("textbox", name="App key", exact=True)).to_be_visible()
            status, _ = self._gateway(registered["token"]).call("GET", "/v1/sessions")
            assert status == 401, status
            self._forgive(n_problems)
        finally:
            for context in contexts:
                context.close()
            self._revoke([device_id])

    def push_notification_shows_and_answers(self):
        """phone.md "Push": the Notifications switch says truthfully what the browser allowed;
        a push of a real pending permission request shows the session, the question and its two
        answers; "Run it" from the notification answers it through the API (the command runs);
        a plain click takes the console to the request's deep link; an answer given in the page
        closes the question's notification; a hidden page without a push subscription has the
        worker say a finished turn."""
        page = self.page
        self.tab("Chat")
        self.context.grant_permissions(["notifications"], origin=self.origin)
        page.wait_for_function("navigator.serviceWorker.controller !== null")
        status, key = self._gateway().call("GET", "/v1/push/key")
        assert status == 200 and len(base64.urlsafe_b64decode(key["public_key"] + "==")) == 65, (status, key)
        self._worker_token(page, page.evaluate("localStorage.getItem('warren.token')"))
        pending = []
        try:
            # The switch. Headless Chromium has no push service (off the record it refuses at
            # once): the switch must say so and stay off, and nothing reaches the gateway.
            account = self._open_account()
            switch = account.get_by_role("switch", name="Notifications", exact=True)
            state = account.get_by_role("status", name="Notifications state", exact=True)
            expect(switch).to_have_attribute("aria-checked", "false")
            expect(state).to_contain_text("Off")
            n_problems = len(self.problems)
            switch.click()
            expect(state).to_have_text(re.compile(r"^(On|Not turned on)"), timeout=30_000)
            self._forgive(n_problems, NO_PUSH_OFF_THE_RECORD)
            status, subscriptions = self.api().call("GET", "/v1/push/subscriptions")
            assert status == 200, (status, subscriptions)
            if state.text_content().startswith("On"):
                # A browser with a push service: the subscription is the gateway's, and goes.
                expect(switch).to_have_attribute("aria-checked", "true")
                assert len(subscriptions) == 1, subscriptions
                switch.click()
                expect(state).to_contain_text("Off")
                assert self.api().call("GET", "/v1/push/subscriptions")[1] == []
            else:
                expect(switch).to_have_attribute("aria-checked", "false")
                expect(switch).to_be_enabled()
                assert subscriptions == [], subscriptions
            assert page.evaluate("Notification.permission") == "granted"
            self._dialog_fits(account)
            self.shot("account-notifications")
            account.get_by_role("button", name="Close", exact=True).click()

            # A real question of the session, pushed as the gateway pushes it.
            cdp = self.context.new_cdp_session(page)
            registration_id = self._registration_id(cdp)
            worker = self._service_worker()
            self.api().wait_idle(self.session_id)
            self.send("touch pushed.txt")
            self.wait_tool_done("touch pushed.txt")
            group, request_id = self._pending_request("rm pushed.txt")
            pending.append(request_id)
            actions = [{"id": "allow", "title": "Run it"}, {"id": "reject", "title": "Don't run it"}]
            payload = {
                "session": self.session_id, "title": self.title, "kind": "permission_request",
                "text": "The agent asks to run: rm pushed.txt", "url": f"/#/s/{self.session_id}/r/{request_id}",
                "actions": actions, "request": request_id,
            }
            tag = f"{self.session_id}:{request_id}"
            [shown] = self._pushed_and_shown(cdp, registration_id, payload, tag)
            assert (shown["title"], shown["body"]) == (self.title, "The agent asks to run: rm pushed.txt"), shown
            assert shown["actions"] == [["allow", "Run it"], ["reject", "Don't run it"]], shown
            assert shown["requireInteraction"] and shown["renotify"], shown
            assert shown["data"]["url"] == payload["url"], shown

            # "Run it" on the notification: the worker answers with the device token.
            assert worker.evaluate(CLICK_NOTIFICATION, [tag, "allow"]) == "clicked"
            expect(group).to_contain_text("Answered: Run it")
            pending.remove(request_id)
            self.wait_tool_done("rm pushed.txt")
            expect(self.tool("rm pushed.txt").last).to_have_class(re.compile("tool-completed"))
            status, listing = self.api().call("GET", f"/v1/sessions/{self.session_id}/files?path=&depth=1")
            assert status == 200 and all(e["name"] != "pushed.txt" for e in listing["entries"]), listing
            # Said at once ("Answering: Run it…"), then how it went, in place of the question.
            [said] = self._notifications(tag, lambda n: len(n) == 1 and n[0]["body"].startswith("Answered:"))
            assert said["body"] == "Answered: Run it" and said["actions"] == [] and not said["requireInteraction"], said

            # A plain click: the console goes to the request's deep link.
            second_group, second_id = self._pending_request("rm -f never-there.txt")
            pending.append(second_id)
            second_tag = f"{self.session_id}:{second_id}"
            second_url = f"/#/s/{self.session_id}/r/{second_id}"
            second_payload = {**payload, "text": "The agent asks to run: rm -f never-there.txt", "url": second_url, "request": second_id}
            self._pushed_and_shown(cdp, registration_id, second_payload, second_tag)
            with page.expect_event("framenavigated", predicate=lambda frame: frame == page.main_frame and frame.url.endswith(second_url)):
                assert worker.evaluate(CLICK_NOTIFICATION, [second_tag, ""]) == "clicked"
            expect(page.get_by_role("heading", name=self.title, exact=True)).to_be_visible()
            expect(second_group).to_be_visible()
            self._notifications(second_tag, lambda n: n == [])  # a click closes it

            # Answered in the page while its notification is up: the notification goes.
            self._pushed_and_shown(cdp, registration_id, second_payload, second_tag)
            second_group.get_by_role("button", name="Don't run it", exact=True).click()
            expect(second_group).to_contain_text("Answered: Don't run it")
            pending.remove(second_id)
            self._notifications(second_tag, lambda n: n == [])

            # A hidden page with no push subscription: its own event stream's finished turn is
            # said by the worker, like a push. (Headless Chromium keeps every page visible, so
            # the page is told it is hidden.)
            page.evaluate("Object.defineProperty(document, 'hidden', { configurable: true, get: () => true })")
            try:
                self.api().wait_idle(self.session_id)
                self.send("echo said-while-hidden")
                [ended] = self._notifications(f"{self.session_id}:turn_end", lambda n: len(n) == 1)
            finally:
                page.evaluate("delete document.hidden")
            assert (ended["title"], ended["body"], ended["actions"]) == (self.title, "The agent finished.", []), ended
            expect(self.agent_text("said-while-hidden")).to_have_count(1)
            cdp.detach()
        finally:
            self._close_dialogs()
            for request_id in pending:
                self.api().call("POST", f"/v1/sessions/{self.session_id}/permissions/{request_id}", {"option_id": "reject"})
            page.evaluate("navigator.serviceWorker.ready.then((r) => r.getNotifications()).then((shown) => shown.forEach((n) => n.close()))")
