// The account (phone.md "Pairing"): the Account panel (this device, its Notifications switch,
// "Pair another device" with the code as a QR image, text and link counting down to its
// expiry, the owner's devices with Revoke), the sign-in screen's "Have a pairing code?" form
// and the `#/pair/<code>` link that fills it in, and the confirmations of revoking a device and
// of signing out, which say what they cost. Signing out revokes this device on the gateway
// before the token is forgotten, so a copy of the token is worth nothing.
//
// main.js keeps the token and switches between the sign-in screen and the app: the join form
// hands it the new token (`onJoined`), the sign-out confirmation says whether to forget it
// (`confirmSignOut`). The pure parts (codes, countdowns, words) are tested in
// Node (test/devices.test.mjs).

import { createApi } from "./api.js";
import { PushSwitch } from "./push.js";

// ---- pure ----

const CODE_CHARS = /^[A-Z0-9]{8}$/;

function decoded(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return ""; // a damaged escape: no code
  }
}

/** A pairing code as the gateway writes it ("ABCD-EFGH") from what a person typed or pasted:
 *  any case, with or without the dash, spaces, or the whole pairing link. Null when it cannot
 *  be one. */
export function normalizePairCode(text) {
  if (typeof text !== "string") return null;
  const fromLink = text.match(/#\/pair\/([^/?#\s]+)/);
  const raw = (fromLink ? decoded(fromLink[1]) : text).toUpperCase().replace(/[\s-]/g, "");
  return CODE_CHARS.test(raw) ? `${raw.slice(0, 4)}-${raw.slice(4)}` : null;
}

/** The code of a `#/pair/<code>` location hash ("" when the hash is not one, null when its
 *  code is malformed). */
export function pairCodeFromHash(hash) {
  const match = /^#\/pair\/(.*)$/.exec(hash ?? "");
  if (!match) return "";
  return normalizePairCode(decoded(match[1]));
}

/** The time left to a deadline, in words: "4:59 left", "expired". */
export function countdownText(msLeft) {
  if (!(msLeft > 0)) return "Expired";
  const seconds = Math.ceil(msLeft / 1000);
  return `Expires in ${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
}

/** When a code received at `receivedAtMs` (this browser's clock) expires, from the gateway's
 *  `expires_at`. A phone's clock can be off by minutes: an expiry that does not fall within
 *  the 5 minutes a code lives (give or take a few seconds) is taken as 5 minutes from receipt. */
export function pairDeadline(expiresAt, receivedAtMs) {
  const lifetimeMs = 5 * 60 * 1000;
  const expires = Date.parse(expiresAt);
  const left = expires - receivedAtMs;
  return Number.isFinite(left) && left > 0 && left <= lifetimeMs + 5000 ? expires : receivedAtMs + lifetimeMs;
}

/** How long ago `thenMs` was, in words. */
export function agoWords(thenMs, nowMs) {
  const minutes = Math.floor((nowMs - thenMs) / 60000);
  if (!Number.isFinite(minutes)) return "";
  if (minutes < 1) return "just now";
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.floor(minutes / 60);
  if (hours < 24) return `${hours} h ago`;
  const days = Math.floor(hours / 24);
  return days === 1 ? "yesterday" : `${days} days ago`;
}

/** One device of the list in words: "this device · used 2 min ago · added 3 days ago ·
 *  notifications on". */
export function deviceWords(device, nowMs) {
  const used = device.last_used_at ? `used ${agoWords(Date.parse(device.last_used_at), nowMs)}` : "never used";
  const added = device.created_at ? `added ${agoWords(Date.parse(device.created_at), nowMs)}` : "";
  const push = device.push_subscriptions > 0 ? "notifications on" : "";
  const out = device.signed_in === false ? "signed out (its token expired)" : "";
  return [device.current ? "this device" : "", out, used, added, push].filter(Boolean).join(" · ");
}

/** The devices, this one first, then the most recently used. */
export function sortDevices(devices) {
  const used = (d) => Date.parse(d.last_used_at ?? d.created_at ?? "") || 0;
  return [...devices].sort((a, b) => Number(b.current) - Number(a.current) || used(b) - used(a) || a.device_id.localeCompare(b.device_id));
}

/** What signing out costs, as paragraphs, given the owner's other devices' ids. */
export function signOutWords(others) {
  const first = "This browser forgets its token, and the gateway revokes this device: the token cannot be used again, and this device gets no more notifications.";
  if (others.length === 0) {
    return [
      first,
      "This is the only device with your sessions. Nothing is deleted, but after this only the gateway's admin can bring them back (an admin reset of this device, then registering it again with the app key): registering another device with the app key makes a new device with sessions of its own. To keep them at hand, pair another device first (Account, Pair another device).",
    ];
  }
  const names = others.length <= 3 ? others.join(", ") : `${others.slice(0, 3).join(", ")} and ${others.length - 3} more`;
  return [
    first,
    `Your sessions are not deleted: they stay with your other ${others.length === 1 ? "device" : "devices"} (${names}). To see them here again, pair this browser from one of them.`,
  ];
}

/** An SVG document as a `data:` URL for an `<img>` (base64 of its UTF-8 bytes). */
export function svgDataUrl(svg) {
  const bytes = new TextEncoder().encode(svg);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return `data:image/svg+xml;base64,${btoa(binary)}`;
}

/** A new device id: `phone-…` or `browser-…` and 10 random letters and digits (a revoked id
 *  can never register again, so every registration takes a fresh one). */
export function newDeviceId(kind = "browser", random = (n) => crypto.getRandomValues(new Uint8Array(n))) {
  const alphabet = "abcdefghijkmnpqrstuvwxyz23456789";
  return `${kind}-${[...random(10)].map((b) => alphabet[b % alphabet.length]).join("")}`;
}

// ---- confirmations ----

/**
 * Asks in the page's confirmation dialog (`#confirm`): `title`, `paragraphs`, the confirming
 * button's `confirm` label (in the danger colour unless `danger` is false), and with `field`
 * (`{label, value}`) a text box (Enter confirms).
 * `action(text)` runs on confirmation, with the box's text; if it throws, its message is shown
 * and the dialog stays, so the person can try again or cancel. Resolves true once the action
 * succeeded, false when cancelled.
 */
export function confirmDialog({ title, paragraphs, confirm, cancelable = true, danger = true, field = null, action = async () => {} }) {
  const dialog = document.getElementById("confirm");
  const ok = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  const error = document.getElementById("confirm-error");
  const box = document.getElementById("confirm-field");
  document.getElementById("confirm-field-row").hidden = !field;
  document.getElementById("confirm-field-label").textContent = field?.label ?? "";
  box.value = field?.value ?? "";
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").replaceChildren(
    ...paragraphs.map((text) => {
      const p = document.createElement("p");
      p.textContent = text;
      return p;
    }),
  );
  ok.textContent = confirm;
  ok.className = danger ? "danger" : "primary";
  ok.disabled = false;
  cancel.hidden = !cancelable;
  showError(error, "");
  return new Promise((resolve) => {
    let answer = false;
    const onOk = async () => {
      if (ok.disabled) return;
      ok.disabled = true;
      try {
        await action(box.value.trim());
      } catch (failure) {
        ok.disabled = false;
        showError(error, failure.message);
        return;
      }
      answer = true;
      dialog.close();
    };
    const onCancel = () => dialog.close();
    const onEnter = (event) => {
      if (event.key === "Enter" && !event.isComposing) {
        event.preventDefault();
        onOk();
      }
    };
    // Escape while the action runs would leave it done and unsaid.
    const onEscape = (event) => {
      if (ok.disabled) event.preventDefault();
    };
    // However it closes (a button, Escape, a sign-out elsewhere), it answers once.
    const onClose = () => {
      ok.removeEventListener("click", onOk);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onEscape);
      dialog.removeEventListener("close", onClose);
      box.removeEventListener("keydown", onEnter);
      resolve(answer);
    };
    ok.addEventListener("click", onOk);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onEscape);
    dialog.addEventListener("close", onClose);
    box.addEventListener("keydown", onEnter);
    dialog.showModal();
    (field ? box : cancelable ? cancel : ok).focus();
    if (field) box.select();
  });
}

// ---- the Account panel ----

export class AccountPanel {
  /** `api`: the page's, with the token. */
  constructor({ api }) {
    this.api = api;
    this.dialog = $("account");
    // { code, url, deadline, known: the device ids when it was made (null: not listed yet),
    //   joined: the id of the device that used it }
    this.pairing = null;
    this.timer = null;
    this.deviceIds = new Set(); // as last listed
    this.push = new PushSwitch({ elements: { button: $("push-switch"), status: $("push-state") }, api });
    $("account-open").addEventListener("click", () => this.open());
    $("account-close").addEventListener("click", () => this.dialog.close());
    this.dialog.addEventListener("close", () => this.stopCountdown());
    $("pair-start").addEventListener("click", () => this.mintCode());
    $("pair-new").addEventListener("click", () => this.mintCode());
    $("devices").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-revoke]");
      if (button) this.revoke(button.dataset.revoke);
    });
  }

  open() {
    // A code that was used or expired is not shown again; a live one is, still counting.
    if (this.pairing && (this.pairing.joined || this.pairing.deadline <= Date.now())) this.forgetPairing();
    if (!this.dialog.open) this.dialog.showModal();
    $("account-close").focus();
    this.loadDevices();
    this.push.refresh();
    if (this.pairing) this.startCountdown();
  }

  close() {
    if (this.dialog.open) this.dialog.close();
  }

  /** Forgets what the panel showed (at sign-out). */
  reset() {
    this.close();
    if ($("confirm").open) $("confirm").close();
    this.forgetPairing();
    $("devices").replaceChildren();
    this.deviceIds = new Set();
    $("account-device").textContent = "";
  }

  forgetPairing() {
    this.pairing = null;
    this.stopCountdown();
    $("pairing").hidden = true;
    $("pair-start").hidden = false;
    showError($("pair-error"), "");
  }

  async loadDevices() {
    let answer;
    try {
      answer = await this.api.request("GET", "/v1/devices");
    } catch (error) {
      showError($("devices-error"), error.status === 401 ? "" : `Could not load the devices: ${error.message}`);
      return;
    }
    showError($("devices-error"), "");
    this.renderDevices(sortDevices(answer.devices ?? []));
  }

  renderDevices(devices) {
    const now = Date.now();
    const current = devices.find((device) => device.current);
    $("account-device").textContent = current?.device_id ?? "";
    this.deviceIds = new Set(devices.map((device) => device.device_id));
    // A device that was not there when the code was made: it joined, with this code most likely.
    if (this.pairing && this.pairing.known === null) this.pairing.known = new Set(this.deviceIds);
    const joined = this.pairing && !this.pairing.joined && devices.find((device) => !this.pairing.known.has(device.device_id));
    if (joined) {
      this.pairing.joined = joined.device_id;
      this.startCountdown();
    }
    $("devices").replaceChildren(
      ...devices.map((device) => {
        const item = document.createElement("li");
        item.className = "device";
        if (device.current) item.setAttribute("aria-current", "true");
        const name = document.createElement("code");
        name.className = "device-id";
        name.textContent = device.device_id;
        const words = document.createElement("span");
        words.className = "meta";
        words.textContent = deviceWords(device, now);
        const text = document.createElement("div");
        text.className = "device-text";
        text.append(name, words);
        item.append(text);
        if (!device.current) {
          const revoke = document.createElement("button");
          revoke.type = "button";
          revoke.className = "danger";
          revoke.dataset.revoke = device.device_id;
          revoke.setAttribute("aria-label", `Revoke ${device.device_id}`);
          revoke.textContent = "Revoke";
          item.append(revoke);
        }
        return item;
      }),
    );
  }

  async revoke(deviceId) {
    const revoked = await confirmDialog({
      title: `Revoke ${deviceId}?`,
      paragraphs: [
        "Its token stops working at once: that browser is signed out the next time it asks the gateway anything, and it gets no more notifications.",
        "Your sessions stay, here and on your other devices. That browser can come back only with a new pairing code, or by registering with the app key (as a new device with sessions of its own).",
      ],
      confirm: "Revoke device",
      action: async () => {
        try {
          await this.api.request("DELETE", `/v1/devices/${encodeURIComponent(deviceId)}`);
        } catch (error) {
          if (error.code !== "DEVICE_NOT_FOUND") throw new Error(`Not revoked: ${error.message}`);
        }
      },
    });
    if (revoked) this.loadDevices();
  }

  async mintCode() {
    showError($("pair-error"), "");
    let answer;
    try {
      answer = await this.api.request("POST", "/v1/devices/pair");
    } catch (error) {
      if (error.status !== 401) showError($("pair-error"), `No pairing code: ${error.message}`);
      return;
    }
    this.pairing = {
      code: answer.code,
      url: answer.url,
      deadline: pairDeadline(answer.expires_at, Date.now()),
      known: this.deviceIds.size ? new Set(this.deviceIds) : null,
      joined: null,
    };
    $("pair-qr").src = svgDataUrl(answer.qr_svg ?? "");
    $("pair-code-text").textContent = answer.code;
    $("pair-url").textContent = answer.url;
    $("pairing").hidden = false;
    $("pair-start").hidden = true;
    this.startCountdown();
  }

  /** Counts the code down each second, and looks for the device that joins with it every few. */
  startCountdown() {
    this.stopCountdown();
    const joined = this.pairing?.joined;
    $("pair-joined").hidden = !joined;
    // Most likely with this code; another of the owner's devices may have paired it, so this
    // says only what is known.
    $("pair-joined").textContent = joined ? `${joined} joined: it sees your sessions now. A code works once; make a new one for another device.` : "";
    $("pairing").classList.toggle("used", !!joined);
    let ticks = 0;
    const tick = () => {
      const left = this.pairing ? this.pairing.deadline - Date.now() : 0;
      $("pair-countdown").hidden = !!joined;
      $("pair-countdown").textContent = left > 0 ? countdownText(left) : "Expired: make a new code.";
      $("pairing").classList.toggle("expired", left <= 0 && !joined);
      if (left <= 0 || joined) return this.stopCountdown();
      if (++ticks % 3 === 0) this.loadDevices();
    };
    tick();
    if (this.timer === null && this.pairing && !joined && this.pairing.deadline > Date.now()) this.timer = setInterval(tick, 1000);
  }

  stopCountdown() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /**
   * Sign-out, asked first: says what it costs (with the owner's other devices named), then
   * revokes this device on the gateway. Resolves true when this browser is signed out of the
   * gateway (main.js then forgets the token), false when the person kept it.
   */
  async confirmSignOut() {
    let devices = [];
    try {
      devices = (await this.api.request("GET", "/v1/devices")).devices ?? [];
    } catch (error) {
      if (error.status === 401) return false; // already signed out by the 401 itself
    }
    const self = devices.find((device) => device.current);
    const others = devices.filter((device) => !device.current).map((device) => device.device_id);
    this.close();
    return confirmDialog({
      title: "Sign out of this browser?",
      paragraphs: devices.length ? signOutWords(others) : [signOutWords(["another device"])[0]],
      confirm: "Sign out and revoke",
      action: async () => {
        let id = self?.device_id;
        try {
          id ??= (await this.api.request("GET", "/v1/devices")).devices?.find((device) => device.current)?.device_id;
          if (!id) throw new Error("the gateway did not say which device this is");
          await this.api.request("DELETE", `/v1/devices/${encodeURIComponent(id)}`);
        } catch (error) {
          // A token that no longer works is signed out already.
          if (error.status === 401 || error.code === "DEVICE_NOT_FOUND") return;
          throw new Error(`Not signed out: ${error.message}. The token still works; try again when the gateway answers.`);
        }
      },
    });
  }
}

// ---- joining with a pairing code ----

/** A pairing link opened in a browser that is signed in already: the code is left unused
 *  (another browser is meant to join with it). */
export function pairLinkWhileSignedIn(code) {
  return confirmDialog({
    title: "This browser is signed in already",
    paragraphs: [
      `The pairing code ${code ?? ""} was not used: open the link on the device you want to add, or type the code there under “Have a pairing code?”. It works once, until it expires.`.replace("  ", " "),
      "To move this browser to that code's sessions, sign out first, then open the link again.",
    ],
    confirm: "OK",
    cancelable: false,
  });
}

/**
 * The sign-in screen's "Have a pairing code?" form: registers this browser with the code under
 * a fresh device id (`POST /v1/devices` with `pair_code`, no app key), then `onJoined(token,
 * deviceId)`. `showError(text)` says what went wrong in the form ("" clears it).
 */
export class JoinForm {
  constructor({ onJoined, showError: say }) {
    this.onJoined = onJoined;
    this.say = say;
    $("join-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.join();
    });
  }

  /** Shows the form first and fills it in when the page was opened with a pairing link
   *  (`code` from `pairCodeFromHash`: "" for none, null for a link with a damaged code). */
  fill(code) {
    $("signin").toggleAttribute("data-pairing", code !== "");
    if (code === null) this.say("That pairing link holds no valid code: type the code the other device shows.");
    if (!code) return;
    $("pair-code").value = code;
    $("join-button").focus();
  }

  async join() {
    const code = normalizePairCode($("pair-code").value);
    this.say("");
    if (!code) {
      this.say("A pairing code is 8 letters and digits, like ABCD-EFGH.");
      return;
    }
    const kind = matchMedia("(pointer: coarse)").matches ? "phone" : "browser";
    const register = (deviceId) => createApi({}).request("POST", "/v1/devices", { json: { device_id: deviceId, pair_code: code } });
    let deviceId = newDeviceId(kind);
    let answer;
    try {
      try {
        answer = await register(deviceId);
      } catch (error) {
        // A random id that is taken or was revoked: another one.
        if (error.code !== "DEVICE_ALREADY_BOUND" && error.code !== "DEVICE_REVOKED") throw error;
        deviceId = newDeviceId(kind);
        answer = await register(deviceId);
      }
    } catch (error) {
      this.say(
        error.code === "INVALID_PAIR_CODE"
          ? "That pairing code is wrong, used or expired. Make a new one on a signed-in device (Account, Pair another device)."
          : `Could not join: ${error.message}`,
      );
      return;
    }
    $("pair-code").value = "";
    $("signin").removeAttribute("data-pairing");
    if (pairCodeFromHash(location.hash) !== "") history.replaceState(null, "", location.pathname);
    this.onJoined(answer.token, answer.device_id ?? deviceId);
  }
}

function $(id) {
  return document.getElementById(id);
}

function showError(element, text) {
  element.textContent = text;
  element.hidden = text === "";
}
