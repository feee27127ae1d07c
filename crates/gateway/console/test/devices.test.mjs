// The account's pure parts (devices.js): a pairing code as typed or scanned, the pairing link's
// hash, the countdown to a code's expiry (with a phone clock that is off), the device list's
// words and order, what signing out costs, the QR image's data URL, fresh device ids.

import { test } from "node:test";
import assert from "node:assert/strict";

import {
  agoWords,
  countdownText,
  deviceWords,
  newDeviceId,
  normalizePairCode,
  pairCodeFromHash,
  pairDeadline,
  signOutWords,
  sortDevices,
  svgDataUrl,
} from "../devices.js";

test("a pairing code is read in any case, with or without the dash, or from its link", () => {
  const cases = [
    ["ABCD-EFGH", "ABCD-EFGH"],
    ["abcd efgh", "ABCD-EFGH"],
    ["abcdefgh", "ABCD-EFGH"],
    ["  AbCd-eFgH \n", "ABCD-EFGH"],
    ["ab cd - ef gh", "ABCD-EFGH"],
    ["WX23-4567", "WX23-4567"],
    ["https://warren.example/#/pair/abcd-efgh", "ABCD-EFGH"],
    ["https://warren.example/#/pair/abcd%2Defgh", "ABCD-EFGH"],
    ["https://warren.example/#/pair/%E0%A4%A", null],
    ["http://192.168.1.5:8080/#/pair/ABCDEFGH", "ABCD-EFGH"],
    ["", null],
    ["abc", null],
    ["ABCD-EFG", null],
    ["ABCD-EFGHJ", null],
    ["ABCD_EFGH", null],
    ["AB!D-EFGH", null],
    ["ÄBCD-EFGH", null],
    [null, null],
    [undefined, null],
  ];
  for (const [typed, want] of cases) assert.equal(normalizePairCode(typed), want, JSON.stringify(typed));
});

test("the pairing link's hash gives its code, nothing for other hashes, null for a damaged code", () => {
  const cases = [
    ["#/pair/ABCD-EFGH", "ABCD-EFGH"],
    ["#/pair/abcd-efgh", "ABCD-EFGH"],
    ["#/pair/abcd%20efgh", "ABCD-EFGH"],
    ["#/pair/xyz", null],
    ["#/pair/ABCD%E0%A4%A", null],
    ["#/pair/", null],
    ["", ""],
    ["#", ""],
    ["#session=abc&view=chat", ""],
    ["#/s/abc/r/req-1", ""],
    ["#/pairing/ABCD-EFGH", ""],
  ];
  for (const [hash, want] of cases) assert.equal(pairCodeFromHash(hash), want, hash);
});

test("the countdown says minutes and seconds left, rounded up, then expired", () => {
  const cases = [
    [300_000, "Expires in 5:00"],
    [299_500, "Expires in 5:00"],
    [299_000, "Expires in 4:59"],
    [61_000, "Expires in 1:01"],
    [60_000, "Expires in 1:00"],
    [9_000, "Expires in 0:09"],
    [1, "Expires in 0:01"],
    [0, "Expired"],
    [-1_000, "Expired"],
    [NaN, "Expired"],
  ];
  for (const [ms, want] of cases) assert.equal(countdownText(ms), want, String(ms));
});

test("a code's deadline is the gateway's expiry, or 5 minutes from receipt when the clocks disagree", () => {
  const received = Date.parse("2026-03-01T10:00:00Z");
  const cases = [
    ["2026-03-01T10:05:00Z", Date.parse("2026-03-01T10:05:00Z")],
    ["2026-03-01T10:04:58.500Z", Date.parse("2026-03-01T10:04:58.500Z")],
    // This browser's clock is 10 minutes slow, or 10 minutes fast: 5 minutes from now.
    ["2026-03-01T10:15:00Z", received + 300_000],
    ["2026-03-01T09:55:00Z", received + 300_000],
    ["not a time", received + 300_000],
  ];
  for (const [expiresAt, want] of cases) assert.equal(pairDeadline(expiresAt, received), want, expiresAt);
});

test("how long ago, in words", () => {
  const now = Date.parse("2026-03-01T10:00:00Z");
  const cases = [
    [now - 10_000, "just now"],
    [now - 60_000, "1 min ago"],
    [now - 59 * 60_000, "59 min ago"],
    [now - 60 * 60_000, "1 h ago"],
    [now - 23 * 3600_000, "23 h ago"],
    [now - 24 * 3600_000, "yesterday"],
    [now - 5 * 24 * 3600_000, "5 days ago"],
    [NaN, ""],
  ];
  for (const [then, want] of cases) assert.equal(agoWords(then, now), want, String(then));
});

test("a device in words: this one, when used and added, notifications", () => {
  const now = Date.parse("2026-03-01T10:00:00Z");
  assert.equal(
    deviceWords({ device_id: "phone-a", current: true, created_at: "2026-02-27T10:00:00Z", last_used_at: "2026-03-01T09:58:00Z", push_subscriptions: 1 }, now),
    "this device · used 2 min ago · added 2 days ago · notifications on",
  );
  assert.equal(
    deviceWords({ device_id: "browser-b", current: false, created_at: "2026-03-01T09:00:00Z", last_used_at: null, push_subscriptions: 0 }, now),
    "never used · added 1 h ago",
  );
  assert.equal(
    deviceWords({ device_id: "old-laptop", current: false, signed_in: false, created_at: "2026-01-01T10:00:00Z", last_used_at: "2026-01-01T10:00:00Z", push_subscriptions: 0 }, now),
    "signed out (its token expired) · used 59 days ago · added 59 days ago",
  );
});

test("the device list: this device first, then the most recently used", () => {
  const devices = [
    { device_id: "old", current: false, created_at: "2026-01-01T00:00:00Z", last_used_at: "2026-01-02T00:00:00Z" },
    { device_id: "me", current: true, created_at: "2026-01-01T00:00:00Z", last_used_at: "2026-01-01T00:00:00Z" },
    { device_id: "new", current: false, created_at: "2026-01-01T00:00:00Z", last_used_at: "2026-02-01T00:00:00Z" },
    { device_id: "never", current: false, created_at: "2026-01-03T00:00:00Z", last_used_at: null },
  ];
  assert.deepEqual(sortDevices(devices).map((d) => d.device_id), ["me", "new", "never", "old"]);
  assert.equal(devices[0].device_id, "old", "the list given is left as it was");
});

test("sign-out says what it costs: the token revoked, and where the sessions stay", () => {
  const alone = signOutWords([]);
  assert.match(alone[0], /forgets its token/);
  assert.match(alone[0], /revokes this device/);
  assert.match(alone[1], /only device/);
  assert.match(alone[1], /pair another device first/);
  const one = signOutWords(["phone-abc"]);
  assert.match(one[1], /stay with your other device \(phone-abc\)/);
  assert.match(one[1], /pair this browser from one of them/);
  const many = signOutWords(["a", "b", "c", "d", "e"]);
  assert.match(many[1], /other devices \(a, b, c and 2 more\)/);
});

test("the QR code's SVG is an image data URL of its UTF-8 bytes", () => {
  const svg = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 2 2"><title>Paarung – ✓</title><rect width="1" height="1"/></svg>';
  const url = svgDataUrl(svg);
  assert.ok(url.startsWith("data:image/svg+xml;base64,"), url);
  assert.equal(Buffer.from(url.split(",")[1], "base64").toString("utf8"), svg);
});

test("a new device id is a valid, fresh device name", () => {
  const fixed = newDeviceId("phone", (n) => new Uint8Array(n).map((_, i) => i));
  assert.equal(fixed, "phone-abcdefghij");
  const ids = new Set(Array.from({ length: 50 }, () => newDeviceId()));
  assert.equal(ids.size, 50);
  for (const id of ids) assert.match(id, /^browser-[a-z2-9]{10}$/);
  for (const id of ids) assert.match(id, /^[A-Za-z0-9_-]{8,128}$/);
});
