// A small, safe Markdown reader for agent text: paragraphs (a line break stays a line break, as
// in chat apps, because agents and commands print line-shaped text), headings, bullet and
// numbered lists, block quotes, fenced code blocks, inline code, bold, italic and links. It
// returns `vdom` nodes, so text can only ever become text: there is no raw HTML, and a link is
// made only for an `http(s)://` target (anything else is shown as the source text). Deliberately
// absent: tables, images, nested lists, reference links, HTML entities.

import { h } from "./vdom.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^ {0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^ {0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const RULE = /^ {0,3}([-*_])( *\1){2,} *$/;

/** The block nodes for a Markdown text. */
export function markdown(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence)) body.push(lines[i++]);
      i++; // the closing fence (or the end of a text still streaming)
      blocks.push(h("pre", { class: "code" }, h("code", {}, body.join("\n"))));
    } else if (line.trim() === "") {
      i++;
    } else if ((m = HEADING.exec(line))) {
      blocks.push(h(`h${Math.min(m[1].length + 2, 6)}`, {}, inline(m[2])));
      i++;
    } else if (RULE.test(line)) {
      blocks.push(h("hr", {}));
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const numbered = !BULLET.test(line);
      const pattern = numbered ? NUMBERED : BULLET;
      const items = [];
      while (i < lines.length && pattern.test(lines[i])) {
        const parts = [pattern.exec(lines[i]).at(-1)];
        i++;
        // Indented lines continue the item.
        while (i < lines.length && /^ {2,}\S/.test(lines[i]) && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i])) {
          parts.push(lines[i].trim());
          i++;
        }
        items.push(h("li", {}, withBreaks(parts)));
      }
      blocks.push(h(numbered ? "ol" : "ul", {}, items));
    } else if (QUOTE.test(line)) {
      const parts = [];
      while (i < lines.length && QUOTE.test(lines[i])) parts.push(QUOTE.exec(lines[i++])[1]);
      blocks.push(h("blockquote", {}, markdown(parts.join("\n"))));
    } else {
      const parts = [];
      while (i < lines.length && lines[i].trim() !== "" && !startsBlock(lines[i])) parts.push(lines[i++]);
      blocks.push(h("p", {}, withBreaks(parts)));
    }
  }
  return blocks;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || NUMBERED.test(line) || QUOTE.test(line);
}

function withBreaks(lines) {
  const out = [];
  lines.forEach((line, n) => {
    if (n > 0) out.push(h("br", {}));
    out.push(...inline(line));
  });
  return out;
}

// Code spans first (their content is literal), then links, bold, italic and bare web addresses.
const INLINE = new RegExp(
  [
    /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source, // 1, 2: code span
    /\[([^\]\n]+)\]\(([^()\s]+(?:\([^()\s]*\))?)\)/.source, // 3, 4: [text](target)
    /\*\*(?=\S)([^*]*?\S)\*\*/.source, // 5: bold
    /\*(?=[^*\s])([^*]*?[^*\s])\*/.source, // 6: italic
    /(https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"*])/.source, // 7: a bare web address
    /\\([\\`*_[\]()#+\-.!>])/.source, // 8: an escaped punctuation character
  ].join("|"),
  "g",
);

/** The inline nodes (strings and elements) of one line. */
export function inline(text) {
  const out = [];
  let last = 0;
  // `matchAll` works on a copy of the expression, so the recursion for bold and italic is safe.
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[2] !== undefined) out.push(h("code", {}, m[2]));
    else if (m[3] !== undefined) out.push(link(m[4]) ? h("a", link(m[4]), m[3]) : m[0]);
    else if (m[5] !== undefined) out.push(h("strong", {}, inline(m[5])));
    else if (m[6] !== undefined) out.push(h("em", {}, inline(m[6])));
    else if (m[7] !== undefined) out.push(h("a", link(m[7]), m[7]));
    else out.push(m[8]);
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

/** The attributes of a link to `target`, or null when it is not an `http(s)://` address. */
export function link(target) {
  if (!/^https?:\/\/[^\s]+$/i.test(target)) return null;
  return { href: target, rel: "noopener noreferrer", target: "_blank" };
}
