// The Preview view: `POST /previews {"port"}` gives a URL on an origin of its own (never this
// one, so the app the agent wrote cannot read the console's storage or use its token); it opens
// in an iframe titled "Preview" and, through a link, in a new tab. The previews still live are
// offered again when the view opens.

export class PreviewView {
  /** `elements`: form, port, frame, open (the new-tab link), live (list), error. */
  constructor({ elements, api }) {
    this.el = elements;
    this.api = api;
    this.sessionId = null;
    this.el.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.openPort(Number(this.el.port.value));
    });
    this.el.live.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-url]");
      if (!button) return;
      this.showUrl(button.dataset.url, Number(button.dataset.port));
      this.show();
    });
  }

  setSession(sessionId) {
    this.sessionId = sessionId;
    this.showUrl(null);
    this.el.live.replaceChildren();
    this.showError("");
  }

  async show() {
    if (!this.sessionId) return;
    let previews;
    try {
      previews = await this.api.request("GET", `/v1/sessions/${this.sessionId}/previews`);
    } catch {
      return;
    }
    // The other previews still open (the one shown is not offered again).
    const others = previews.filter((preview) => preview.url !== this.el.frame.getAttribute("src"));
    this.el.live.replaceChildren(
      ...others.map((preview) => {
        const item = document.createElement("li");
        const button = document.createElement("button");
        button.type = "button";
        button.dataset.url = preview.url;
        button.dataset.port = preview.port;
        button.textContent = `Show port ${preview.port}`;
        item.append(button);
        return item;
      }),
    );
  }

  hide() {}

  async openPort(port) {
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      this.showError("A port is a whole number from 1 to 65535.");
      return;
    }
    let preview;
    try {
      preview = await this.api.request("POST", `/v1/sessions/${this.sessionId}/previews`, { json: { port } });
    } catch (error) {
      this.showError(`No preview: ${error.message}`);
      return;
    }
    this.showError("");
    this.showUrl(preview.url, port);
    this.show();
  }

  showUrl(url, port) {
    const { frame, open } = this.el;
    if (!url || !/^https?:\/\//.test(url)) {
      frame.hidden = true;
      frame.removeAttribute("src");
      open.hidden = true;
      open.removeAttribute("href");
      return;
    }
    if (port) this.el.port.value = String(port);
    // Reassigning the same src reloads it, which is what "Open preview" again should do.
    frame.src = url;
    frame.hidden = false;
    open.href = url;
    open.hidden = false;
  }

  showError(text) {
    this.el.error.textContent = text;
    this.el.error.hidden = text === "";
  }
}
