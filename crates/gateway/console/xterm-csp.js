// Lets xterm.js style itself under the console's CSP (`style-src 'self'`, no 'unsafe-inline').
// xterm.js puts CSS text into `<style>` elements it creates (theme colours, row sizes,
// scrollbar) and sets `style` attributes with `setAttribute` (24-bit colours); CSP refuses both,
// logging an error each time. The CSSOM is allowed, so this routes both through it:
// - `document.createElement("style")` gives an inert `<warren-style>` element (hidden by
//   app.css) whose `textContent` is kept in a constructed style sheet adopted by the document;
//   the sheet goes when the element has left the document (`pruneDetachedStyles`);
// - `setAttribute("style", text)` becomes `element.style.cssText = text`.
// The console's own code creates no `<style>` and sets no `style` attribute, so nothing else is
// affected. Installed once, before xterm.js creates its first terminal.

const sheets = new Map(); // <warren-style> element → its CSSStyleSheet
const seenConnected = new WeakSet();
let installed = false;

function styleStandIn(doc, create) {
  const element = create.call(doc, "warren-style");
  let text = "";
  Object.defineProperty(element, "textContent", {
    get: () => text,
    set: (value) => {
      text = String(value ?? "");
      let sheet = sheets.get(element);
      if (!sheet) {
        sheet = new CSSStyleSheet();
        sheets.set(element, sheet);
        doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
      }
      sheet.replaceSync(text);
      pruneDetachedStyles();
    },
  });
  return element;
}

export function installXtermCspShim() {
  if (installed) return;
  installed = true;
  const create = Document.prototype.createElement;
  Document.prototype.createElement = function createElementWithoutStyle(tag, options) {
    if (String(tag).toLowerCase() === "style") return styleStandIn(this, create);
    return create.call(this, tag, options);
  };
  const setAttribute = Element.prototype.setAttribute;
  Element.prototype.setAttribute = function setAttributeThroughCssom(name, value) {
    if (String(name).toLowerCase() === "style") {
      this.style.cssText = String(value);
      return;
    }
    setAttribute.call(this, name, value);
  };
}

/** Drops the sheets of stand-ins that were in the document and left it (a disposed terminal's). */
export function pruneDetachedStyles() {
  for (const [element] of sheets) if (element.isConnected) seenConnected.add(element);
  const gone = [...sheets].filter(([element]) => !element.isConnected && seenConnected.has(element));
  if (gone.length === 0) return;
  const dropped = new Set(gone.map(([, sheet]) => sheet));
  for (const [element] of gone) sheets.delete(element);
  document.adoptedStyleSheets = document.adoptedStyleSheets.filter((sheet) => !dropped.has(sheet));
}
