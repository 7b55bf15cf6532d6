// A scenario's records, newest first, with their feedback (filter and cursor paging).

import { get } from "../api.js";
import { badge, clip, contentText, empty, h, idChip, num, panel, table, time } from "../dom.js";

const PAGE = 25;
const FILTERS = [
  ["true", "With feedback"],
  ["false", "Without feedback"],
  ["", "All records"],
];
// The records listing's `origin` filter (GET /reef/scenarios/{s}/records?origin=): live
// traffic, or records imported from one format (their `reef.origin` tag). The values are
// read once from the API description (its `origin` enum), so a new import format shows up
// without a change here; these are the fallback when it cannot be read.
const FALLBACK_ORIGINS = ["live", "import:reef", "import:openai-chat", "import:openai-finetune"];
let knownOrigins = null;

async function originValues() {
  if (knownOrigins === null) {
    try {
      const response = await fetch(new URL("../openapi.json", document.baseURI), { cache: "no-store" });
      const doc = await response.json();
      const listing = doc.paths["/reef/scenarios/{scenario}/records"].get;
      const origin = listing.parameters.find((p) => p.name === "origin");
      knownOrigins = origin.schema.enum;
    } catch {
      knownOrigins = FALLBACK_ORIGINS;
    }
  }
  return knownOrigins;
}

function originLabel(value) {
  if (value === "") return "Any origin";
  if (value === "live") return "Live traffic";
  return value.startsWith("import:") ? `Imported: ${value.slice("import:".length)}` : value;
}

/** Where a record came from: "live" (served through the gateway), or its import origin
 * (`import:<format>`) with the source's id on hover. */
export function originCell(record) {
  const tags = record.tags || {};
  const origin = tags["reef.origin"];
  if (!origin) return h("span", { class: "muted" }, "live");
  const source = tags["reef.source_id"];
  return h("span", { class: "badge origin", title: source ? `source id: ${source}` : "" }, origin);
}

/** The last user message of a record's request (OpenAI chat or Responses, Anthropic). */
export function requestText(record) {
  const request = record.request || {};
  if (typeof request.input === "string") return request.input;
  // a Responses request's input items: messages have a role (their type may be left out)
  const messages = request.messages || (Array.isArray(request.input) ? request.input : []);
  const users = messages.filter((m) => m.role === "user");
  return users.length ? contentText(users[users.length - 1].content) : "";
}

/** The reply text of a record's response (OpenAI chat or Responses, Anthropic), or its
 * error. */
export function responseText(record) {
  const response = record.response;
  if (!response) return record.error ? `error: ${record.error}` : "";
  if (Array.isArray(response.choices) && response.choices.length) {
    const message = response.choices[0].message || {};
    return contentText(message.content) || (message.tool_calls ? "[tool calls]" : "");
  }
  if (Array.isArray(response.content)) return contentText(response.content);
  if (Array.isArray(response.output)) {  // a Responses response: message and call items
    const texts = response.output.filter((item) => item.type === "message")
      .map((item) => contentText(item.content));
    const calls = response.output.some((item) => item.type === "function_call");
    return texts.join(" ") || (calls ? "[tool calls]" : "");
  }
  return "";
}

/** "#3" for a release of the chain (full id on hover), else the short id (a candidate
 * serving as a canary, or a release older than the page of releases read). */
export function releaseLabel(id, seqOf) {
  if (!id) return h("span", { class: "muted" }, "—");
  return seqOf.has(id) ? h("span", { title: id }, `#${seqOf.get(id)}`) : idChip(id);
}

/** The #/ link to a session's trajectory page. */
export function sessionHref(scenario, sessionId) {
  return `#/scenarios/${encodeURIComponent(scenario)}/sessions/${encodeURIComponent(sessionId)}`;
}

/** A session chip linking to its trajectory. */
export function sessionLink(scenario, sessionId) {
  return h("a", { href: sessionHref(scenario, sessionId), class: "session-link", title: "trajectory" },
    idChip(sessionId));
}

/** Scores, feedback text and corrections attached to a record (quarantined ones flagged). */
export function feedbackCell(record) {
  if (!record.feedback || !record.feedback.length) return h("span", { class: "muted" }, "—");
  return h("div", { class: "feedback" }, record.feedback.map((fb) => {
    const score = fb.score === null ? null : badge(num(fb.score, 2), fb.score >= 1 ? "good" : fb.score <= 0 ? "bad" : "warn");
    const text = fb.feedback === null ? "" : typeof fb.feedback === "string" ? fb.feedback : JSON.stringify(fb.feedback);
    const correction = fb.correction === null ? null
      : h("div", { class: "small" }, h("span", { class: "muted" }, "correction: "),
        clip(typeof fb.correction === "string" ? fb.correction : JSON.stringify(fb.correction), 80));
    // held back by screening (never trained on, never gate evidence) until released
    const held = fb.quarantined_at && !fb.released_at
      ? [" ", h("span", { class: "badge bad held", title: fb.quarantine_reason || "" }, "quarantined")] : null;
    return h("div", {}, score, " ", clip(text, 80), held, correction);
  }));
}

function link(scenario, filter, origin, cursor) {
  const query = new URLSearchParams();
  query.set("feedback", filter);
  if (origin) query.set("origin", origin);
  if (cursor) query.set("cursor", cursor);
  return `#/scenarios/${encodeURIComponent(scenario)}/records?${query}`;
}

export async function render([name], query) {
  const filter = query.has("feedback") ? query.get("feedback") : "true";
  const origin = query.get("origin") || "";
  const cursor = query.get("cursor");
  const [page, releases, originList] = await Promise.all([
    get(`reef/scenarios/${encodeURIComponent(name)}/records`, { limit: PAGE, has_feedback: filter, origin, cursor }),
    get(`reef/scenarios/${encodeURIComponent(name)}/releases`, { limit: 1000 }),
    originValues(),
  ]);
  const seqOf = new Map(releases.data.map((r) => [r.id, r.seq]));
  const select = h("select", { id: "feedback-filter", "aria-label": "filter" },
    FILTERS.map(([value, label]) => h("option", { value, selected: value === filter }, label)));
  select.addEventListener("change", () => { location.hash = link(name, select.value, origin, null); });
  const origins = h("select", { id: "origin-filter", "aria-label": "origin" },
    ["", ...originList].map((value) => h("option", { value, selected: value === origin }, originLabel(value))));
  origins.addEventListener("change", () => { location.hash = link(name, filter, origins.value, null); });
  const rows = page.data;
  return h("div", {},
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Scenarios"), " / ",
      h("a", { href: `#/scenarios/${encodeURIComponent(name)}` }, name), " / records"),
    h("h1", {}, `Records of ${name}`),
    h("p", { class: "subtitle" }, "Newest first. Purpose serve is live traffic (the only traffic learners train on, besides imported history unless a recipe excludes it); eval and canary records come from the gate and canaries. Origin says whether a record was served through the gateway (live) or imported (import:<format>)."),
    h("div", { class: "toolbar" }, select, " ", origins,
      cursor ? h("a", { href: link(name, filter, origin, null) }, "← Newest") : null),
    panel(null, rows.length
      ? h("div", { id: "records" }, table([
        ["When", (r) => time(r.created_at)],
        ["Record", (r) => idChip(r.id)],
        ["Release", (r) => releaseLabel(r.release_id, seqOf)],
        ["Purpose", (r) => badge(r.purpose, r.purpose === "serve" ? "info" : "")],
        ["Origin", (r) => originCell(r)],
        ["Session", (r) => [sessionLink(name, r.session_id), ` turn ${r.turn}`]],
        ["Asked", (r) => clip(requestText(r), 100), "text"],
        ["Answered", (r) => [r.status !== "ok" ? [badge(r.status), " "] : null, clip(responseText(r), 100)], "text"],
        ["Feedback", (r) => feedbackCell(r), "text"],
      ], rows))
      : empty(origin ? "No records of this origin." : filter === "true" ? "No records with feedback yet." : "No records yet.")),
    page.next_cursor ? h("p", {}, h("a", { href: link(name, filter, origin, page.next_cursor), id: "older" }, "Older →")) : null);
}
