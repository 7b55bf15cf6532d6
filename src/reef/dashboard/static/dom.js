// Building DOM from elements and text nodes only (no markup parsed from data, nothing
// the CSP would block), the small formatters every page shares, and the reload signal.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(parent, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(parent, child);
    else if (child instanceof Node) parent.appendChild(child);
    else parent.appendChild(document.createTextNode(String(child)));
  }
}

function build(element, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      element.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(element, children);
  return element;
}

/** An HTML element: h("a", {href: "#/"}, "text", child, [more]). */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, same signature as h(). */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** The window event after which the shell renders the current route again (app.js). */
export const RELOAD_EVENT = "reef:reload";

/** Render the current page again (its data changed: an action succeeded). */
export function reloadPage() {
  window.dispatchEvent(new Event(RELOAD_EVENT));
}

/** Replace the children of `node`. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

/** The last 8 characters of an id (UUIDv7 ids share their leading time bits). */
export function shortId(id) {
  if (!id) return "—";
  return id.replace(/-/g, "").slice(-8);
}

/** A link-less id chip with the full id on hover. */
export function idChip(id) {
  return h("code", { title: id || "" }, shortId(id));
}

/** "sha256:0123…" → "0123456789ab" (the 12 hex digits model names use). */
export function shortDigest(digest) {
  if (!digest) return "none";
  return digest.replace(/^sha256:/, "").slice(0, 12);
}

/** A timestamp (ISO string or epoch seconds) as local date and time. */
export function when(value) {
  if (value === null || value === undefined) return "—";
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** How long ago, roughly ("5 min ago"). */
export function ago(value) {
  const date = typeof value === "number" ? new Date(value * 1000) : new Date(value);
  const seconds = Math.max(0, (Date.now() - date.getTime()) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

/** A <time> element: local time, relative age on hover. */
export function time(value) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "—");
  return h("time", { title: ago(value) }, when(value));
}

/** A number with `digits` decimals, "—" when missing. */
/** "1 turn", "3 turns": a count with its noun in the right number. */
export function count(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}

export function num(value, digits = 3) {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  return Number(value).toFixed(digits);
}

/** A signed number, classed pos/neg for colour. */
export function signed(value, digits = 3) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "—");
  const text = (value > 0 ? "+" : "") + Number(value).toFixed(digits);
  return h("span", { class: value > 0 ? "pos" : value < 0 ? "neg" : "" }, text);
}

const TONES = {
  good: ["passed", "published", "serving", "succeeded", "done", "ok", "create", "learn", "promote", "adopt"],
  bad: ["rejected", "failed", "error", "abandoned", "aborted", "cancelled"],
  warn: ["pending", "evaluating", "undecided", "staging", "queued", "running", "canary", "rollback"],
};

/** A coloured status badge. */
export function badge(text, tone) {
  const picked = tone || Object.keys(TONES).find((name) => TONES[name].includes(text)) || "";
  return h("span", { class: ["badge", picked] }, text);
}

/** A table; `columns` are [header, cell(row) → node|string, className?]. */
export function table(columns, rows, rowClass) {
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map(([title, , cls]) => h("th", { class: cls }, title)))),
    h("tbody", {}, rows.map((row) =>
      h("tr", { class: rowClass ? rowClass(row) : null },
        columns.map(([, cell, cls]) => h("td", { class: cls }, cell(row)))))));
}

/** A panel with a heading and content. */
export function panel(title, ...content) {
  return h("section", { class: "panel" }, title ? h("h2", {}, title) : null, content);
}

/** An empty state line. */
export function empty(text) {
  return h("p", { class: "empty" }, text);
}

/** Text of an OpenAI/Anthropic message content (string or parts). */
export function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (typeof part === "string" ? part : part.text || `[${part.type}]`)).join(" ");
  }
  return JSON.stringify(content);
}

/** Shorten long text for table cells (full text on hover). */
export function clip(text, most = 160) {
  const value = text === null || text === undefined ? "" : String(text);
  if (value.length <= most) return value;
  return h("span", { title: value }, value.slice(0, most - 1) + "…");
}
