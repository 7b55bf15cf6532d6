// A scenario's feedback trust: how far each computed feedback source (conversation
// signals, judges) agrees with what people posted, a sample of the complaints the signal
// rules read no value from (they score an answer 0 but give nothing to train on or to
// evaluate against), then the quarantined feedback (what
// screening held back from training and from the gate's evidence, with its reasons,
// newest first; an admin may release a row).
//
// Feedback text, corrections, reasons and author names come from whoever holds a key:
// they are inserted as text nodes only (dom.js), never as markup.

import { ApiError, get, post } from "../api.js";
import { badge, clip, empty, h, idChip, num, reloadPage, table, time } from "../dom.js";

const PAGE = 25;
const MAX_PAGE = 500; // the route's largest limit

/** JSON-ish value (feedback text, a correction) as one line of text. */
export function valueText(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

/** "planted_instruction: …; burst: …" → one entry per rule: its name, then the details. */
function reasonList(reason) {
  if (!reason) return h("span", { class: "muted" }, "—");
  const parts = reason.split(/; (?=[a-z_]+: )/);
  return h("ul", { class: "reasons compact" }, parts.map((part) => {
    const at = part.indexOf(": ");
    const rule = at > 0 ? part.slice(0, at) : null;
    return h("li", {}, rule ? [h("code", { class: "rule" }, rule), " "] : null,
      clip(rule ? part.slice(at + 2) : part, 160));
  }));
}

const TRUST_TONES = { operator: "good", user: "warn", untrusted: "bad" };

/** A trust level as a badge (operator green, user amber, untrusted red). */
export function trustBadge(level) {
  return badge(level || "unknown", TRUST_TONES[level] || "");
}

/** Release asks once more before it lets a row train and count as evidence. */
function releaseControl(row) {
  const note = h("div", { class: "small neg", role: "status" });
  const button = h("button", {
    type: "button", class: "secondary", "data-release": row.id,
    title: "Let this feedback through: the next learning run may train on it and use it as gate evidence (a released row is never quarantined again).",
  }, "Release");
  const cancel = h("button", { type: "button", class: "link", hidden: true }, "Cancel");
  let armed = false;
  cancel.addEventListener("click", () => {
    armed = false;
    button.textContent = "Release";
    button.classList.remove("danger");
    cancel.hidden = true;
  });
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = "Confirm release";
      button.classList.add("danger");
      cancel.hidden = false;
      return;
    }
    button.disabled = true;
    button.classList.remove("danger");
    cancel.hidden = true;
    button.textContent = "Releasing…";
    try {
      await post(`reef/feedback/${encodeURIComponent(row.id)}/release`);
    } catch (error) {
      // 404/409: someone else released (or removed) it meanwhile; a refused key: the
      // shell asks for one. Either way the page is read again.
      if (error instanceof ApiError && error.status !== 404 && error.status !== 409) {
        note.textContent = `Not released: ${error.message}`;
        armed = false;
        button.disabled = false;
        button.textContent = "Release";
        return;
      }
    }
    reloadPage();
  });
  return h("div", { class: "release" }, button, " ", cancel, note);
}

function said(row) {
  const text = valueText(row.feedback);
  const correction = valueText(row.correction);
  return h("div", {},
    text ? h("div", { class: "said" }, clip(text, 100)) : null,
    correction ? h("div", { class: "said" }, h("span", { class: "muted" }, "correction: "), clip(correction, 100)) : null,
    !text && !correction ? h("span", { class: "muted" }, "—") : null);
}

/** The quarantined rows: when, author and trust, what they said, why they are held. */
export function quarantineTable(rows) {
  return table([
    ["When", (r) => h("div", {}, time(r.created_at),
      h("div", { class: "small muted" }, "held ", time(r.quarantined_at)),
      h("div", { class: "small" }, idChip(r.id)))],
    ["Author", (r) => h("div", {}, h("code", { class: "author" }, r.principal || "anonymous"),
      h("div", {}, trustBadge(r.trust)))],
    ["Score", (r) => (r.score === null ? "—" : num(r.score, 2)), "num"],
    ["Feedback and correction", (r) => said(r), "text"],
    ["Why it is held", (r) => reasonList(r.quarantine_reason), "text reason"],
    ["", (r) => releaseControl(r)],
  ], rows);
}

function share(value) {
  return value === null || value === undefined ? "—" : `${Math.round(value * 100)}%`;
}

/** Each computed source against posted feedback: rows, overlap, precision, recall. */
export function calibrationTable(rows) {
  return table([
    ["Source", (r) => h("code", { class: "source" }, r.source)],
    ["Rows", (r) => num(r.rows, 0), "num"],
    ["Graded both ways", (r) => num(r.compared, 0), "num"],
    ["Says", (r) => badge(r.polarity, r.polarity === "good" ? "good" : "warn")],
    ["Precision", (r) => share(r.precision), "num precision"],
    ["Recall", (r) => share(r.recall), "num"],
    ["Corrections agree", (r) => `${share(r.corrections_agree)} of ${r.corrections_compared}`, "num"],
  ], rows);
}

const COMPLAINT_SOURCE = "signal:correction";
const COMPLAINT_SAMPLE = 10;

/** Of `rows` (feedback, newest first), the complaints without a value: conversation
 * signals that said an answer was wrong and extracted no corrected value. */
export function complaintsWithoutValue(rows) {
  return rows.filter((r) => r.source === COMPLAINT_SOURCE && (r.correction === null || r.correction === undefined));
}

/** The sampled complaints: when, the answer's record, what the user said. */
export function complaintTable(rows) {
  return table([
    ["When", (r) => time(r.created_at)],
    ["Answer's record", (r) => (r.record_ids && r.record_ids.length
      ? idChip(r.record_ids[0])
      : h("span", { class: "muted" }, "—"))],
    ["Author", (r) => h("code", { class: "author" }, r.principal || "anonymous")],
    ["What the user said", (r) => clip(valueText(r.feedback), 160), "text"],
  ], rows);
}

function complaintsPanel(rows) {
  const found = complaintsWithoutValue(rows);
  return h("section", { class: "panel", id: "complaints" },
    h("h2", {}, "Complaints without a value"),
    h("p", { class: "small muted" },
      `${found.length} of the newest ${rows.length} feedback rows: the signal rules heard a complaint but ` +
      "read no corrected value from it, so the answer scores 0 but there is nothing to train on or to " +
      "evaluate against. Check the phrasings below against the rules (reef signals preview)."),
    found.length
      ? complaintTable(found.slice(0, COMPLAINT_SAMPLE))
      : empty("No complaint without a value among the newest feedback."));
}

/** The newest quarantined feedback of a scenario (`limit` rows, older than `before`). */
export function quarantined(scenario, limit, before) {
  return get(`reef/scenarios/${encodeURIComponent(scenario)}/feedback`, { quarantined: "true", limit, before });
}

function link(scenario, limit, before) {
  const query = new URLSearchParams();
  if (limit !== PAGE) query.set("limit", String(limit));
  if (before) query.set("before", before);
  const search = query.toString();
  return `#/scenarios/${encodeURIComponent(scenario)}/feedback${search ? `?${search}` : ""}`;
}

function pageSize(query) {
  const asked = Number.parseInt(query.get("limit") || "", 10);
  return Number.isFinite(asked) && asked >= 1 ? Math.min(asked, MAX_PAGE) : PAGE;
}

export async function render([name], query) {
  const limit = pageSize(query);
  const before = query.get("before");
  const [page, calibration, newest] = await Promise.all([
    quarantined(name, limit, before),
    get(`reef/scenarios/${encodeURIComponent(name)}/feedback/calibration`),
    get(`reef/scenarios/${encodeURIComponent(name)}/feedback`, { limit: MAX_PAGE }),
  ]);
  return h("div", {},
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Scenarios"), " / ",
      h("a", { href: `#/scenarios/${encodeURIComponent(name)}` }, name), " / quarantined feedback"),
    h("h1", {}, `Quarantined feedback of ${name}`),
    h("p", { class: "subtitle" },
      "Newest first. Learning runs screen feedback below operator trust before training and hold back what " +
      "looks like poisoning (one correction repeated across many inputs, a correction that contradicts a " +
      "trusted suite, one author flooding a batch, planted instructions or URLs). Held feedback is kept but " +
      "never trained on or used as gate evidence until an admin releases it; a released row is never held again."),
    h("section", { class: "panel", id: "calibration" },
      h("h2", {}, "Computed feedback"),
      h("p", { class: "small muted" },
        "Feedback Reef computed from the traffic (conversation signals, judges), measured against the " +
        "feedback people posted on the same answers: precision is the share of its verdicts people agreed " +
        "with, recall the share of the answers people called bad (good, for an acceptance) that it caught."),
      calibration.data.length
        ? calibrationTable(calibration.data)
        : empty("No computed feedback yet: a recipe's signals or judges write it.")),
    complaintsPanel(newest.data),
    h("h2", {}, "Quarantined"),
    before ? h("div", { class: "toolbar" }, h("a", { href: link(name, limit, null), id: "newest" }, "← Newest")) : null,
    h("section", { class: "panel", id: "quarantine" },
      page.data.length
        ? quarantineTable(page.data)
        : empty(before ? "No older quarantined feedback." : "Nothing is quarantined in this scenario.")),
    page.next_before
      ? h("p", {}, h("a", { href: link(name, limit, page.next_before), id: "older" }, "Older →"))
      : null);
}
