// The on-screen keyboard: while it is open the page is laid out in what is left of the screen.
// A phone's keyboard shrinks the visual viewport (`window.visualViewport`); depending on the
// browser the layout viewport shrinks with it (Android's `resizes-content`) or stays whole
// (iOS, Android's default), and then the bottom of the page (the message box, the terminal's
// key bar) would be under the keyboard. So `watchViewport` sets on `<html>`:
// - `--vvh`: the visual viewport's height, `--vv-top`: its offset in the layout viewport;
// - the class `keyboard` while, on a touch screen, a text field has the focus and the visual
//   viewport is much shorter than the tallest it has been at this width (`keyboardOpen`).
// app.css then sizes the body to `--vvh` (placed at `--vv-top`) and folds the header into one
// line. Nothing else reads the keyboard: a resize is a resize.

/** The visual viewport at this fraction of its full height or less, with a text field focused,
 *  means the keyboard is open (a keyboard takes 35–50 % of a phone's screen). */
export const KEYBOARD_FRACTION = 0.75;

/** Whether the keyboard is open: a text field has the focus (`editing`) and the visible height
 *  is at most KEYBOARD_FRACTION of the full one. */
export function keyboardOpen({ visibleHeight, fullHeight, editing }) {
  return Boolean(editing) && fullHeight > 0 && visibleHeight <= fullHeight * KEYBOARD_FRACTION;
}

/** Whether `element` takes typing (and so opens the keyboard on a phone). */
export function isEditable(element) {
  if (!element) return false;
  if (element.isContentEditable) return true;
  if (element.tagName === "TEXTAREA") return true;
  if (element.tagName !== "INPUT") return false;
  return !["button", "checkbox", "color", "file", "hidden", "image", "radio", "range", "reset", "submit"].includes(element.type);
}

/** Follows the visual viewport of `win` and keeps `<html>`'s variables and class current. */
export function watchViewport(win = window) {
  const doc = win.document;
  const root = doc.documentElement;
  const viewport = win.visualViewport;
  // Only a touch screen has an on-screen keyboard; a desktop window made shorter is just that.
  const touch = win.matchMedia("(pointer: coarse)");
  // The tallest height seen at the current width: a rotation is a new screen.
  let width = 0;
  let fullHeight = 0;
  const update = () => {
    const visibleHeight = viewport ? viewport.height : win.innerHeight;
    const top = viewport ? viewport.offsetTop : 0;
    const currentWidth = win.innerWidth;
    if (currentWidth !== width) {
      width = currentWidth;
      fullHeight = 0;
    }
    fullHeight = Math.max(fullHeight, win.innerHeight, visibleHeight);
    root.style.setProperty("--vvh", `${Math.round(visibleHeight)}px`);
    root.style.setProperty("--vv-top", `${Math.round(top)}px`);
    const open = keyboardOpen({ visibleHeight, fullHeight, editing: touch.matches && isEditable(doc.activeElement) });
    if (open !== root.classList.contains("keyboard")) {
      root.classList.toggle("keyboard", open);
      // The layout changed under the focused field: keep it in view.
      if (open) doc.activeElement?.scrollIntoView?.({ block: "nearest" });
    }
  };
  viewport?.addEventListener("resize", update);
  viewport?.addEventListener("scroll", update);
  win.addEventListener("resize", update);
  doc.addEventListener("focusin", update);
  // The focus leaves a field before the next one takes it: look once both happened.
  doc.addEventListener("focusout", () => win.setTimeout(update, 0));
  update();
  return update;
}
