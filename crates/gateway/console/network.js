// The Network view: what the session's hands may reach (network.md). `GET /egress` gives the
// hands' network mode, the egress policy, the allow and deny rules, the destinations seen lately
// and the credentials the proxy may set (`available_credentials`, the names of those on in
// `credentials`); every change (the policy, a rule added or removed, "Allow"/"Deny" on a
// destination, a credential's switch) is one `PUT /egress` of the whole policy and rules (and,
// for a switch, the credentials on), built from the last answer, one at a time, so two quick
// taps never undo each other. The view refreshes when it opens and, while open,
// when the stream says the egress changed (at most once a second). Only a `private` network has
// an egress proxy; in the other modes the view says so and offers nothing to edit.
//
// The pure parts (words, byte counts, the rule and credential lists as `vdom` nodes, the next
// policy body) are exported for the tests; host names, rules and credential names reach the
// page only as text. No credential's value ever reaches the console.

import { hostPort } from "./conversation.js";
import { h, toDom } from "./vdom.js";

/** The policies, in the select's order, with what each lets through in one line. */
export const POLICIES = {
  none: "Nothing gets out unless an allow rule names it.",
  registries: "Package registries and code hosts pass; any other destination is asked.",
  ask: "Every destination no rule covers is asked.",
  open: "Any public address passes; private and local addresses still need a rule.",
};

const NETWORK_WORDS = {
  private: "Private network: the sandbox reaches the internet only through Warren's egress proxy, by the policy and rules below.",
  none: "No network: the sandbox reaches only itself (loopback). No egress proxy, so rules do not apply.",
  host: "Host network: no egress proxy, the sandbox's commands use the host's own network directly. Rules do not apply.",
  remote: "Remote hands: the sandbox has whatever network its host gives it. Rules do not apply.",
};

/** The hands' network mode in words. */
export function networkWords(network) {
  return NETWORK_WORDS[network] ?? `Network: ${network ?? "unknown"}.`;
}

/** The explanation under the policy select; asked policies say how long a question waits. */
export function policyWords(policy, askTimeoutS) {
  const words = POLICIES[policy] ?? `Policy ${policy}.`;
  if ((policy === "registries" || policy === "ask") && typeof askTimeoutS === "number") {
    return `${words} A question waits ${askTimeoutS} s for an answer, then the connection is refused.`;
  }
  return words;
}

const UNITS = ["B", "kB", "MB", "GB", "TB"];

/** A byte count in human units: "0 B", "999 B", "1.2 kB", "568 kB", "3.4 MB". */
export function formatBytes(bytes) {
  let value = Number(bytes) || 0;
  let unit = 0;
  while (value >= 999.5 && unit < UNITS.length - 1) {
    value /= 1000;
    unit++;
  }
  if (unit === 0) return `${Math.round(value)} B`;
  return `${value < 9.95 ? value.toFixed(1) : Math.round(value)} ${UNITS[unit]}`;
}

/** How long ago `iso` was, from `now` (ms): "just now", "5 min ago", "3 h ago", "2 d ago". */
export function seenWords(iso, now) {
  const then = Date.parse(iso ?? "");
  if (Number.isNaN(then)) return "";
  const seconds = Math.max(0, (now - then) / 1000);
  if (seconds < 60) return "just now";
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
  return `${Math.floor(seconds / 86400)} d ago`;
}

/** One recent destination's details in words: "policy registries · sent 1.2 kB, received 568 kB · 2 connections". */
export function destinationWords(destination, now) {
  const connections = destination.connections ?? 0;
  return [
    destination.rule,
    `sent ${formatBytes(destination.bytes_up)}, received ${formatBytes(destination.bytes_down)}`,
    connections === 1 ? "1 connection" : `${connections} connections`,
    now === undefined ? "" : seenWords(destination.last_seen, now),
  ]
    .filter(Boolean)
    .join(" · ");
}

const sameRule = (a, b) => a.toLowerCase() === b.toLowerCase();

/** The PUT body with `rule` added to `list` ("allow" or "deny") and taken out of the other one
 *  (deny wins, so an allow rule next to the same deny rule would do nothing); null when there is
 *  nothing to change. */
export function withRule(egress, list, rule) {
  const other = list === "allow" ? "deny" : "allow";
  const body = { policy: egress.policy, allow: [...(egress.allow ?? [])], deny: [...(egress.deny ?? [])] };
  const inOther = body[other].some((r) => sameRule(r, rule));
  if (body[list].some((r) => sameRule(r, rule)) && !inOther) return null;
  if (!body[list].some((r) => sameRule(r, rule))) body[list].push(rule);
  body[other] = body[other].filter((r) => !sameRule(r, rule));
  return body;
}

/** The PUT body with `rule` taken out of `list`; null when it is not there. */
export function withoutRule(egress, list, rule) {
  const body = { policy: egress.policy, allow: [...(egress.allow ?? [])], deny: [...(egress.deny ?? [])] };
  const kept = body[list].filter((r) => r !== rule);
  if (kept.length === body[list].length) return null;
  body[list] = kept;
  return body;
}

/** The PUT body with another policy; null when it is the same. */
export function withPolicy(egress, policy) {
  if (policy === egress.policy) return null;
  return { policy, allow: [...(egress.allow ?? [])], deny: [...(egress.deny ?? [])] };
}

/** The names of the credentials on for the session: `credentials` (names; `{name}` objects are
 *  read too), or, from a gateway that does not send it, those `available_credentials` marks
 *  `enabled`. */
export function credentialsOn(egress) {
  if (Array.isArray(egress?.credentials)) {
    return egress.credentials.map((c) => (typeof c === "string" ? c : c?.name ?? "")).filter(Boolean);
  }
  return (egress?.available_credentials ?? []).filter((c) => c.enabled === true).map((c) => c.name);
}

/** The PUT body with credential `name` turned on or off: the policy and rules as they are, and
 *  `credentials` the names then on, among those offered, in their order (a name no longer offered
 *  would only be refused); null when `name` is not offered or already so. */
export function withCredential(egress, name, on) {
  const offered = (egress.available_credentials ?? []).map((c) => c.name);
  if (!offered.includes(name)) return null;
  const names = new Set(credentialsOn(egress));
  if (names.has(name) === on) return null;
  if (on) names.add(name);
  else names.delete(name);
  return {
    policy: egress.policy,
    allow: [...(egress.allow ?? [])],
    deny: [...(egress.deny ?? [])],
    credentials: offered.filter((n) => names.has(n)),
  };
}

const ADD_CREDENTIAL = "warren serve --hands-credential NAME=HOST:HEADER:VALUE";

/** The Credentials section's content: what credentials at the edge are, then each credential the
 *  session's device may use (its name, hosts and header) with an on/off switch where the hands
 *  have an egress proxy. `saving` maps a name to the state a PUT in flight is giving it (its
 *  switch is disabled meanwhile); `errors` maps a name to why its last switch failed. */
export function renderCredentials(egress, saving = new Map(), errors = new Map()) {
  const offered = egress.available_credentials ?? [];
  const editable = egress.network === "private";
  const intro = !editable
    ? h("p", { class: "meta" }, "Credentials need an egress proxy: the hands must run with ", h("code", {}, "--hands-network private"), ". The proxy sets them on the way out, so their values never enter the sandbox.")
    : offered.length === 0
      ? h("p", { class: "meta" }, "No credentials to offer. To add one, start the gateway with ", h("code", {}, ADD_CREDENTIAL), ": the egress proxy then sets the header on HTTPS requests to the host, and the value never enters the sandbox.")
      : h("p", { class: "meta" }, "The egress proxy sets a credential's header on the HTTPS requests to its hosts: values never enter the sandbox, and the agent sees only the answers.");
  // A switch refused for a credential no longer offered (its item gone) is still said.
  const orphans = [...errors].filter(([name]) => !offered.some((c) => c.name === name)).map(([, text]) => h("p", { class: "error", role: "alert" }, text));
  if (offered.length === 0) return [intro, ...orphans];
  const on = new Set(credentialsOn(egress));
  const items = offered.map((credential) => {
    const name = credential.name;
    const isOn = on.has(name);
    const pending = saving.has(name);
    const state = pending ? (saving.get(name) ? "Turning on…" : "Turning off…") : isOn ? "On" : "Off";
    const error = errors.get(name);
    return h(
      "li",
      { class: isOn ? "credential-item credential-on" : "credential-item" },
      h(
        "div",
        { class: "credential-head" },
        h("code", { class: "credential-name" }, name),
        editable
          ? h("button", { type: "button", class: isOn ? "small switch switch-on" : "small switch", role: "switch", "aria-checked": isOn ? "true" : "false", "aria-label": `Use ${name}`, "data-credential": name, disabled: pending }, state)
          : h("span", { class: "meta" }, isOn ? "on" : "off"),
      ),
      h(
        "p",
        { class: "meta credential-where" },
        "sets ",
        h("code", {}, credential.header ?? ""),
        " on ",
        (credential.hosts ?? []).map((host, i) => [i ? ", " : "", h("code", {}, host)]),
      ),
      error ? h("p", { class: "error", role: "alert" }, error) : null,
    );
  });
  return [intro, h("ul", { class: "credential-list" }, items), ...orphans];
}

/** The items of an allow or deny list: each rule with its "Remove <rule>" button. */
export function renderRules(list, rules, editable) {
  if (rules.length === 0) return [h("li", { class: "meta" }, list === "allow" ? "No allow rules." : "No deny rules.")];
  return rules.map((rule) =>
    h(
      "li",
      { class: "rule" },
      h("code", {}, rule),
      editable ? h("button", { type: "button", class: "small", "data-action": "remove", "data-list": list, "data-rule": rule, "aria-label": `Remove ${rule}` }, "Remove") : null,
    ),
  );
}

/** The items of the recent destinations: host:port, allowed or refused, the rule, bytes and
 *  connections, and (where rules apply) "Allow <host:port>" / "Deny <host:port>". */
export function renderDestinations(recent, editable, now) {
  if (recent.length === 0) return [h("li", { class: "meta" }, "Nothing reached yet.")];
  return recent.map((destination) => {
    const target = hostPort(destination.host, destination.port);
    const decision = destination.decision === "refused" ? "refused" : destination.decision === "allowed" ? "allowed" : null;
    return h(
      "li",
      { class: "destination" },
      h(
        "p",
        { class: "destination-head" },
        h("code", {}, target),
        decision ? h("span", { class: `decision decision-${decision}` }, decision === "refused" ? "Refused" : "Allowed") : null,
      ),
      h("p", { class: "meta" }, destinationWords(destination, now)),
      editable
        ? h(
            "div",
            { class: "actions" },
            h("button", { type: "button", class: "small", "data-action": "allow", "data-rule": target, "aria-label": `Allow ${target}` }, "Allow"),
            h("button", { type: "button", class: "small", "data-action": "deny", "data-rule": target, "aria-label": `Deny ${target}` }, "Deny"),
          )
        : null,
    );
  });
}

/** What a failed PUT says to the person: the gateway's own words for a bad rule, a network
 *  without a proxy or a credential not offered. */
export function egressErrorWords(error) {
  if (["INVALID_EGRESS_RULE", "NO_EGRESS_PROXY", "UNKNOWN_CREDENTIAL"].includes(error.code)) return error.message;
  return `not saved (${error.message})`;
}

const REFRESH_MS = 1000;

export class NetworkView {
  /** `elements`: mode, error, policy (select), policyHelp, allowList, allowForm, allowInput,
   *  allowError, denyList, denyForm, denyInput, denyError, recent, credentials (the Credentials
   *  section's content), refresh;
   *  `timers` and `now` stand in for the browser's in tests. */
  constructor({ elements, api, timers = globalThis, now = () => Date.now() }) {
    this.el = elements;
    this.api = api;
    this.timers = timers;
    this.now = now;
    this.sessionId = null;
    this.egress = null; // the last answer of GET or PUT /egress
    this.visible = false;
    this.stale = true;
    this.timer = null;
    this.lastRefresh = 0;
    this.queue = Promise.resolve(true); // GETs and PUTs, one at a time
    this.credentialSaves = new Map(); // credential name → the state a PUT in flight gives it
    this.credentialErrors = new Map(); // credential name → why its last switch failed

    this.el.policy.addEventListener("change", () => {
      const policy = this.el.policy.value;
      this.save((egress) => withPolicy(egress, policy), (error) => {
        this.showError(this.el.error, `Policy not changed: ${egressErrorWords(error)}`);
        this.render();
      });
    });
    for (const list of ["allow", "deny"]) {
      this.el[`${list}Form`].addEventListener("submit", (event) => {
        event.preventDefault();
        this.addRule(list);
      });
      this.el[`${list}Input`].addEventListener("input", () => this.showError(this.el[`${list}Error`], ""));
    }
    const onAction = (event) => {
      const button = event.target.closest("button[data-action]");
      if (!button) return;
      const { action, list, rule } = button.dataset;
      const change = action === "remove" ? (egress) => withoutRule(egress, list, rule) : (egress) => withRule(egress, action, rule);
      this.save(change, (error) => this.showError(this.el.error, `Rules not changed: ${egressErrorWords(error)}`));
    };
    this.el.allowList.addEventListener("click", onAction);
    this.el.denyList.addEventListener("click", onAction);
    this.el.recent.addEventListener("click", onAction);
    this.el.credentials.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-credential]");
      if (button) this.toggleCredential(button.dataset.credential);
    });
    this.el.refresh.addEventListener("click", () => this.refresh());
  }

  setSession(sessionId) {
    this.sessionId = sessionId;
    this.egress = null;
    this.stale = true;
    if (this.timer !== null) this.timers.clearTimeout(this.timer);
    this.timer = null;
    for (const list of ["allow", "deny"]) {
      this.el[`${list}Input`].value = "";
      this.showError(this.el[`${list}Error`], "");
    }
    this.showError(this.el.error, "");
    // New maps, so a switch still saving for the previous session cannot touch this one's.
    this.credentialSaves = new Map();
    this.credentialErrors = new Map();
    this.render();
  }

  show() {
    this.visible = true;
    return this.refresh();
  }

  hide() {
    this.visible = false;
  }

  /** The egress changed (an `egress` event, a request asked or answered): refresh while open, at
   *  most once a second; otherwise when the view opens. */
  changed() {
    this.stale = true;
    if (!this.visible || this.timer !== null) return;
    const wait = Math.max(0, this.lastRefresh + REFRESH_MS - this.now());
    this.timer = this.timers.setTimeout(() => {
      this.timer = null;
      if (this.visible && this.stale) this.refresh();
    }, wait);
  }

  url() {
    return `/v1/sessions/${encodeURIComponent(this.sessionId)}/egress`;
  }

  /** Loads the egress settings again. Queued with the saves, so an answer from before a change
   *  never overwrites the change's own answer. */
  refresh() {
    return this.enqueue(async () => {
      if (!this.sessionId) return false;
      const sessionId = this.sessionId;
      this.stale = false;
      this.lastRefresh = this.now();
      return this.request(sessionId, "GET", undefined, (error) =>
        this.showError(this.el.error, `Could not load the network settings: ${error.message}`));
    });
  }

  /** Adds the rule typed in the allow or deny box; a refused rule keeps the text and says why. */
  async addRule(list) {
    const input = this.el[`${list}Input`];
    const errorEl = this.el[`${list}Error`];
    const rule = input.value.trim();
    if (rule === "") return;
    const saved = await this.save((egress) => withRule(egress, list, rule), (error) => this.showError(errorEl, `Not added: ${egressErrorWords(error)}`));
    // Only clear what was added: more may have been typed meanwhile.
    if (saved && input.value.trim() === rule) {
      input.value = "";
      this.showError(errorEl, "");
    }
  }

  /** Turns credential `name` on or off, from the state on screen; its switch is disabled until
   *  the PUT is answered, and a refusal is said under it. A refusal by the gateway (a credential
   *  no longer offered, a network without a proxy) loads the settings again. */
  async toggleCredential(name) {
    const saves = this.credentialSaves;
    const errors = this.credentialErrors;
    if (!this.egress || saves.has(name)) return false;
    const on = !credentialsOn(this.egress).includes(name);
    saves.set(name, on);
    errors.delete(name);
    this.render();
    let refused = false;
    const saved = await this.save((egress) => withCredential(egress, name, on), (error) => {
      refused = error.status === 400 || error.status === 409;
      errors.set(name, `${on ? "Not turned on" : "Not turned off"}: ${egressErrorWords(error)}`);
    });
    saves.delete(name);
    if (saves !== this.credentialSaves) return saved; // another session is shown now
    this.render();
    if (refused) this.refresh();
    return saved;
  }

  /** Queues one change: `change(egress)` gives the PUT body from the newest answer (null: nothing
   *  to do). Resolves to whether it was saved; `onError(error)` hears a refusal. */
  save(change, onError) {
    return this.enqueue(async () => {
      const sessionId = this.sessionId;
      if (!sessionId || !this.egress) return false;
      const body = change(this.egress);
      if (!body) return true;
      return this.request(sessionId, "PUT", { json: body }, onError);
    });
  }

  /** One GET or PUT of `sessionId`'s egress: its answer shown if that session is still the
   *  view's; `onError(error)` hears a failure. Resolves to whether it was taken. */
  async request(sessionId, method, options, onError) {
    let egress;
    try {
      egress = await this.api.request(method, this.url(), options);
    } catch (error) {
      if (sessionId === this.sessionId) onError(error);
      return false;
    }
    if (sessionId !== this.sessionId) return false;
    this.showError(this.el.error, "");
    this.egress = egress;
    this.render();
    return true;
  }

  /** Runs `task` after every request queued before it; resolves to its result. */
  enqueue(task) {
    const run = this.queue.then(() => task());
    this.queue = run.catch(() => false);
    return run;
  }

  render() {
    const egress = this.egress;
    const editable = egress?.network === "private";
    this.el.mode.textContent = egress ? networkWords(egress.network) : "";
    this.el.policy.value = egress?.policy ?? "";
    this.el.policy.disabled = !editable;
    this.el.policyHelp.textContent = egress ? policyWords(egress.policy, egress.ask_timeout_s) : "";
    for (const list of ["allow", "deny"]) {
      const nodes = egress ? renderRules(list, egress[list] ?? [], editable) : [];
      this.el[`${list}List`].replaceChildren(...nodes.map((node) => toDom(node, document)));
      for (const control of this.el[`${list}Form`].elements) control.disabled = !editable;
    }
    const recent = egress ? renderDestinations(egress.recent ?? [], editable, this.now()) : [];
    this.el.recent.replaceChildren(...recent.map((node) => toDom(node, document)));
    const credentials = egress ? renderCredentials(egress, this.credentialSaves, this.credentialErrors) : [];
    this.el.credentials.replaceChildren(...credentials.map((node) => toDom(node, document)));
  }

  showError(element, text) {
    element.textContent = text;
    element.hidden = text === "";
  }
}
