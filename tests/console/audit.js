// The console's accessibility checks, run in the page by tests/console/browser.py: every form
// field has a label; every button and link has text; every text's contrast against the
// background it is drawn on is at least 4.5:1 (WCAG AA). Returns what fails.
function rgb(s) { const m = s.match(/[\d.]+/g).map(Number); return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; }
function lum(c) { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); }
function background(el) { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
  if (c.a > 0.5) return c; } return {r: 255, g: 255, b: 255, a: 1}; }
const failures = [];
for (const el of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
  if (!el.labels.length && !el.getAttribute("aria-label")) failures.push("no label: " + el.outerHTML.slice(0, 80));
}
for (const el of document.querySelectorAll("button, a")) {
  if (!el.textContent.trim() && !el.getAttribute("aria-label")) failures.push("no text: " + el.outerHTML.slice(0, 80));
}
for (const el of document.querySelectorAll("body *")) {
  const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  const style = getComputedStyle(el);
  if (!own || style.visibility === "hidden" || style.display === "none" || el.closest("[hidden]")) continue;
  if (el.offsetWidth === 0 && el.offsetHeight === 0) continue;
  if (el.matches(":disabled, :disabled *")) continue;  // WCAG exempts inactive controls
  const fg = lum(rgb(style.color)), bg = lum(background(el));
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < 4.5) failures.push(`contrast ${ratio.toFixed(2)}: ${el.tagName} ${el.textContent.trim().slice(0, 40)}`);
}
return failures;
