// Terminal output as lines of styled runs (pure, no DOM): what a command printed, ANSI escapes
// and all, turned into `[[{text, cls}]]` (one array of runs per line; `cls` is a space-separated
// list of `ansi-*` classes, "" for plain text). The console's CSP (`style-src 'self'`) allows no
// inline style, so every style is a class of app.css:
// - SGR: bold, dim, italic, underline, strikethrough, inverse, reset (0, and the "off" codes
//   22-29); the 16 colours as foreground (30-37, 90-97) and background (40-47, 100-107); 256
//   colours (38;5;n / 48;5;n) and true colour (38;2;r;g;b) become the nearest of those 16.
// - Every other escape is dropped: cursor moves and erases (CSI), OSC (titles, hyperlinks: the
//   link's text stays), DCS/APC/PM/SOS strings, two-character escapes (charset, keypad), and
//   control characters but tab; a backspace erases the character before it.
// - A carriage return starts the line over: a progress bar redrawn with `\r` shows its last
//   state (the text after the line's last `\r`; a `\r` with nothing after it changes nothing).
// - An escape cut off at the end (output still streaming) is dropped until the rest comes.

export const COLOR_NAMES = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];

// xterm's default palette, to find the nearest of the 16 colours to a 256-colour or RGB one.
const PALETTE = [
  [0, 0, 0], [205, 0, 0], [0, 205, 0], [205, 205, 0], [0, 0, 238], [205, 0, 205], [0, 205, 205], [229, 229, 229],
  [127, 127, 127], [255, 0, 0], [0, 255, 0], [255, 255, 0], [92, 92, 255], [255, 0, 255], [0, 255, 255], [255, 255, 255],
];
const CUBE = [0, 95, 135, 175, 215, 255];

/** The RGB of colour `n` (0-255) of the xterm 256-colour palette. */
export function rgbOf256(n) {
  if (n < 16) return PALETTE[n];
  if (n < 232) {
    const i = n - 16;
    return [CUBE[Math.floor(i / 36)], CUBE[Math.floor(i / 6) % 6], CUBE[i % 6]];
  }
  const grey = 8 + 10 * (n - 232);
  return [grey, grey, grey];
}

/** The nearest of the 16 colours (0-15) to an RGB colour (a weighted distance). */
export function nearest16([r, g, b]) {
  let best = 0;
  let bestDistance = Infinity;
  PALETTE.forEach(([pr, pg, pb], n) => {
    const mean = (r + pr) / 2;
    const d = (2 + mean / 256) * (r - pr) ** 2 + 4 * (g - pg) ** 2 + (2 + (255 - mean) / 256) * (b - pb) ** 2;
    if (d < bestDistance) {
      bestDistance = d;
      best = n;
    }
  });
  return best;
}

/** The class part of colour `n` (0-15): "red", "bright-red". */
export function colorName(n) {
  return n < 8 ? COLOR_NAMES[n] : `bright-${COLOR_NAMES[n - 8]}`;
}

const plainStyle = () => ({ bold: false, dim: false, italic: false, underline: false, strike: false, inverse: false, fg: null, bg: null });

/** The classes of a style. */
export function styleClass(style) {
  const classes = [];
  if (style.bold) classes.push("ansi-bold");
  if (style.dim) classes.push("ansi-dim");
  if (style.italic) classes.push("ansi-italic");
  if (style.underline) classes.push("ansi-underline");
  if (style.strike) classes.push("ansi-strike");
  let { fg, bg } = style;
  if (style.inverse) {
    // The default colours swapped have classes of their own.
    classes.push(bg === null ? "ansi-fg-inverse" : `ansi-${colorName(bg)}`);
    classes.push(fg === null ? "ansi-bg-inverse" : `ansi-bg-${colorName(fg)}`);
    fg = bg = null;
  }
  if (fg !== null) classes.push(`ansi-${colorName(fg)}`);
  if (bg !== null) classes.push(`ansi-bg-${colorName(bg)}`);
  return classes.join(" ");
}

/** Applies the parameters of one SGR sequence (`ESC [ params m`) to `style`. */
export function applySgr(style, params) {
  // Parameters are `;`-separated; a parameter may carry `:`-separated sub-parameters
  // (`38:2::255:0:0`, `4:3`).
  const parts = params === "" ? ["0"] : params.split(";");
  for (let i = 0; i < parts.length; i++) {
    const sub = parts[i].split(":");
    const code = sub[0] === "" ? 0 : Number(sub[0]);
    if (code === 38 || code === 48 || code === 58) {
      let color = null;
      if (sub.length > 1) {
        // Colon form: 38:5:n, 38:2:r:g:b or 38:2:<colour space>:r:g:b.
        const values = sub.slice(1).map((v) => (v === "" ? null : Number(v)));
        if (values[0] === 5) color = indexColor(values[1]);
        else if (values[0] === 2) color = rgbColor(values.length >= 5 ? values.slice(2, 5) : values.slice(1, 4));
      } else if (parts[i + 1] === "5") {
        color = indexColor(Number(parts[i + 2]));
        i += 2;
      } else if (parts[i + 1] === "2") {
        color = rgbColor(parts.slice(i + 2, i + 5).map(Number));
        i += 4;
      }
      // 58 is the underline's colour, not shown; an unreadable colour is no colour.
      if (code === 38) style.fg = color;
      else if (code === 48) style.bg = color;
      continue;
    }
    if (code === 0) Object.assign(style, plainStyle());
    else if (code === 1) style.bold = true;
    else if (code === 2) style.dim = true;
    else if (code === 3) style.italic = true;
    else if (code === 4) style.underline = sub[1] !== "0";
    else if (code === 7) style.inverse = true;
    else if (code === 9) style.strike = true;
    else if (code === 21) style.underline = true;
    else if (code === 22) style.bold = style.dim = false;
    else if (code === 23) style.italic = false;
    else if (code === 24) style.underline = false;
    else if (code === 27) style.inverse = false;
    else if (code === 29) style.strike = false;
    else if (code >= 30 && code <= 37) style.fg = code - 30;
    else if (code === 39) style.fg = null;
    else if (code >= 40 && code <= 47) style.bg = code - 40;
    else if (code === 49) style.bg = null;
    else if (code >= 90 && code <= 97) style.fg = code - 90 + 8;
    else if (code >= 100 && code <= 107) style.bg = code - 100 + 8;
    // Anything else (blink, conceal, fonts, frames, 59) changes nothing shown.
  }
  return style;
}

function indexColor(n) {
  if (!Number.isInteger(n) || n < 0 || n > 255) return null;
  return n < 16 ? n : nearest16(rgbOf256(n));
}

function rgbColor(rgb) {
  if (rgb.length !== 3 || rgb.some((v) => !Number.isInteger(v) || v < 0 || v > 255)) return null;
  return nearest16(rgb);
}

// One token: an escape sequence (its kind and body), a control character, or a run of text.
// CSI: ESC [ (or the 8-bit 0x9b), parameters, intermediates, a final byte.
// String escapes (OSC, DCS, SOS, PM, APC): up to BEL or ST (ESC \ or 0x9c), or the end of the
// text while it is still coming.
const TOKEN = new RegExp(
  [
    /(?:\x1b\[|\x9b)([0-?]*)([ -/]*)([@-~])/.source, // 1 params, 2 intermediates, 3 final
    /(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[\s\S]*?(?:\x07|\x1b\\|\x9c|$)/.source, // a string escape
    /\x1b(?:\[[0-?]*[ -/]*|[ -/]*)$/.source, // an escape cut off at the end of the line
    /\x1b[ -/]*[0-~]/.source, // a two-character (or intermediate) escape
    /\x1b/.source, // a lone ESC
    /([\r\b])/.source, // 4: carriage return, backspace
    /[\x00-\x08\x0b-\x1f\x7f]/.source, // another control character (tab and newline kept)
  ].join("|"),
  "g",
);

/**
 * The lines of terminal output `text`, each an array of `{text, cls}` runs (adjacent runs of
 * one style joined; an empty line is `[]`). A final newline ends the last line rather than
 * starting an empty one.
 */
export function ansiLines(text) {
  const style = plainStyle();
  const lines = [];
  const source = String(text ?? "").replace(/\r+\n/g, "\n");
  const rawLines = source.split("\n");
  if (rawLines.length > 1 && rawLines.at(-1) === "") rawLines.pop();
  for (const raw of rawLines) lines.push(parseLine(raw, style));
  return lines;
}

// Whether a line needs more than one run of the current style.
const SPECIAL = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/;

/** One line (no `\n`) with the style the previous lines left; the style is updated in place. */
function parseLine(raw, style) {
  let cls = styleClass(style);
  if (!SPECIAL.test(raw)) return raw === "" ? [] : [{ text: raw, cls }];
  let runs = [];
  let beforeReturn = null; // the runs before the last `\r`, shown when nothing comes after it
  let last = 0;
  const push = (chunk) => {
    if (chunk === "") return;
    const previous = runs.at(-1);
    if (previous && previous.cls === cls) previous.text += chunk;
    else runs.push({ text: chunk, cls });
  };
  for (const m of raw.matchAll(TOKEN)) {
    push(raw.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[3] === "m" && m[2] === "") cls = styleClass(applySgr(style, m[1]));
    else if (m[4] === "\r") {
      if (runs.some((run) => run.text !== "")) beforeReturn = runs;
      runs = [];
    } else if (m[4] === "\b") {
      eraseLast(runs);
    }
  }
  push(raw.slice(last));
  if (runs.length === 0 && beforeReturn) runs = beforeReturn;
  return runs;
}

function eraseLast(runs) {
  const run = runs.at(-1);
  if (!run) return;
  const chars = [...run.text];
  chars.pop();
  run.text = chars.join("");
  if (run.text === "") runs.pop();
}

/** The plain text of lines from `ansiLines` (no escapes), one `\n` after each line but the last. */
export function plainText(lines) {
  return lines.map((runs) => runs.map((run) => run.text).join("")).join("\n");
}
