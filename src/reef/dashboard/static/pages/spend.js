// Spend: each budget in its current window, what the recorded traffic cost per scenario,
// key, purpose and release (GET /reef/costs, what `reef costs` prints), the requests
// answered without a price, and the requests refused by a budget (402) or a rate limit
// (429), and Reef's own spend: each learning budget in its window (spend.learning_budgets)
// and each recent learning job's cost and its gate decision's (spend.learning). A key
// limited to scenarios sees theirs (and its own key's budget). No automatic refresh:
// /reef/costs reads every record of the period.

import { get } from "../api.js";
import { badge, empty, h, idChip, table, time } from "../dom.js";

const PERIODS = [["24h", "Last 24 hours"], ["7d", "Last 7 days"], ["30d", "Last 30 days"]];
const SUMMED = ["requests", "unpriced", "input_tokens", "cached_input_tokens", "output_tokens", "cost"];

/** Money as `reef costs` prints it, four decimals (two significant digits below 0.01, so
 * a cheap request does not read as free); the unit is the price table's. */
function money(value) {
  if (value === null || value === undefined) return "—";
  const amount = Number(value);
  return amount !== 0 && Math.abs(amount) < 0.01 ? amount.toPrecision(2) : amount.toFixed(4);
}

/** Rows summed per `field` (its value, or "—" when null), costliest first. */
function groupBy(rows, field) {
  const groups = new Map();
  for (const row of rows) {
    const name = row[field] === null || row[field] === undefined ? "—" : row[field];
    const group = groups.get(name) || Object.fromEntries([[field, name], ...SUMMED.map((f) => [f, 0])]);
    for (const f of SUMMED) group[f] += row[f];
    groups.set(name, group);
  }
  return [...groups.values()].sort((a, b) => b.cost - a.cost || String(a[field]).localeCompare(String(b[field])));
}

function unpriced(n) {
  return n ? badge(String(n), "warn") : "0";
}

const COUNTS = [
  ["Requests", (r) => String(r.requests), "num"],
  ["Unpriced", (r) => unpriced(r.unpriced), "num"],
  ["Input", (r) => String(r.input_tokens), "num"],
  ["Cached", (r) => String(r.cached_input_tokens), "num"],
  ["Output", (r) => String(r.output_tokens), "num"],
  ["Cost", (r) => money(r.cost), "num"],
];

function scenarioLink(name) {
  return h("a", { href: `#/scenarios/${encodeURIComponent(name)}` }, name);
}

function spendTable(id, title, rows, first) {
  return h("section", { class: "panel", id }, h("h2", {}, title),
    rows.length ? table([first, ...COUNTS], rows) : empty("No recorded traffic in this period."));
}

/** "12.5000 of 20" with a bar (red once spent), or "—" when the budget does not limit it. */
function used(spent, limit, format) {
  if (limit === null || limit === undefined) return h("span", { class: "muted" }, "—");
  const share = limit > 0 ? spent / limit : 1;
  return h("span", { class: share >= 1 ? "neg" : "" },
    `${format(spent)} of ${limit} `,
    h("progress", { max: "1", value: String(Math.min(share, 1)), title: `${Math.round(share * 100)}%` }));
}

function budgets(lines) {
  if (!lines.length) return empty("No budget applies (budgets: in the configuration).");
  return table([
    ["Budget", (b) => h("code", {}, b.budget)],
    ["Window", (b) => b.window],
    ["Money", (b) => used(b.money, b.money_limit, money)],
    ["Tokens", (b) => used(b.tokens, b.tokens_limit, String)],
    ["Resets", (b) => time(b.resets)],
  ], lines);
}

const LEARNING_KINDS = [["calls", String], ["tokens", String], ["money", money], ["cpu_minutes", (m) => m.toFixed(1)], ["gpu_minutes", (m) => m.toFixed(1)]];

/** Reef's own learning budgets (each scenario's and its recipe's `learning_budget`) in
 * their current window: what each limits, spent of its limit. */
function learningBudgets(lines) {
  if (!lines.length) return empty("No learning budget is configured (learning_budget: in a scenario or recipe).");
  return table([
    ["Budget", (b) => h("code", {}, b.budget)],
    ["Purpose", (b) => badge(b.purpose, "")],
    ["Window", (b) => b.window],
    ["Spent", (b) => h("span", {}, ...LEARNING_KINDS.filter(([kind]) => b[`${kind}_limit`] !== null && b[`${kind}_limit`] !== undefined)
      .map(([kind, format]) => h("span", { class: "learning-use" }, `${kind.replace("_", " ")} `, used(b[kind], b[`${kind}_limit`], format), " ")))],
    ["Resets", (b) => time(b.resets)],
  ], lines);
}

function refusals(rows) {
  if (!rows.length) return empty("No request was refused since this gateway started.");
  return table([
    ["Limit", (r) => h("code", {}, r.limit)],
    ["Kind", (r) => (r.window === "rate" ? badge("rate limit · 429", "warn") : badge(`${r.window} budget · 402`, "bad"))],
    ["Refused", (r) => String(r.count), "num"],
  ], rows);
}

function releases(rows) {
  if (!rows.length) return empty("No recorded traffic in this period.");
  return table([
    ["Scenario", (r) => scenarioLink(r.scenario)],
    ["Release", (r) => (r.release ? idChip(r.release) : h("span", { class: "muted" }, "none"))],
    ["Purpose", (r) => badge(r.purpose, r.purpose === "serve" ? "info" : "")],
    ...COUNTS,
  ], rows);
}

/** One learning tally (a job's `cost`, a gate decision's `spend`) in a few words, as
 * `reef status` prints it: calls, tokens, money (or "unpriced"), training minutes. */
function tally(spent) {
  if (!spent) return h("span", { class: "muted" }, "—");
  const parts = [];
  if (spent.model_calls) {
    parts.push(`${spent.model_calls} call${spent.model_calls === 1 ? "" : "s"}, ${spent.tokens} tok`);
    if (spent.money !== null && spent.money !== undefined) {
      parts.push(money(spent.money) + (spent.unpriced_calls ? ` (+${spent.unpriced_calls} unpriced)` : ""));
    } else if (spent.unpriced_calls) parts.push("unpriced");
  }
  for (const device of ["cpu", "gpu"]) {
    const minutes = spent[`${device}_minutes`];
    if (minutes) parts.push(`${minutes.toFixed(1)} ${device} min`);
  }
  return parts.length ? parts.join(", ") : h("span", { class: "muted" }, "nothing");
}

function learning(jobs) {
  if (!jobs.length) return empty("No finished learning job has a cost yet.");
  return table([
    ["Job", (j) => idChip(j.job_id)],
    ["Scenario", (j) => scenarioLink(j.scenario)],
    ["Outcome", (j) => badge(j.outcome || "—", j.outcome === "budget_exhausted" ? "warn" : "")],
    ["Candidate", (j) => (j.candidate_id ? h("a", { href: `#/candidates/${encodeURIComponent(j.candidate_id)}` }, idChip(j.candidate_id)) : "—")],
    ["Job cost", (j) => tally(j.cost)],
    ["Gate decision", (j) => (j.gate ? h("span", {}, badge(j.gate.action || "—", ""), " ", tally(j.gate.spend)) : h("span", { class: "muted" }, "—"))],
    ["Finished", (j) => time(j.finished_at)],
  ], jobs);
}

export async function render(_params, query) {
  const since = query.get("since") || "7d";
  const [status, byKey, byRelease] = await Promise.all([
    get("reef/status"),
    get("reef/costs", { since, by: "key" }),
    get("reef/costs", { since, by: "release" }),
  ]);
  const spend = status.spend;
  const rows = byKey.data;
  const total = (f) => rows.reduce((sum, r) => sum + r[f], 0);
  const rateRefused = spend.refused.filter((r) => r.window === "rate").reduce((sum, r) => sum + r.count, 0);
  const budgetRefused = spend.refused.filter((r) => r.window !== "rate").reduce((sum, r) => sum + r.count, 0);
  const period = h("select", { id: "since-filter", "aria-label": "period" },
    PERIODS.map(([value, label]) => h("option", { value, selected: value === since }, label)),
    PERIODS.some(([value]) => value === since) ? null : h("option", { value: since, selected: true }, `Since ${since}`));
  period.addEventListener("change", () => { location.hash = `#/spend?since=${encodeURIComponent(period.value)}`; });
  return h("div", {},
    h("h1", {}, "Spend"),
    h("p", { class: "subtitle" }, `Recorded traffic since ${new Date(byKey.since).toLocaleString()}, from each record's own cost (its usage at its model's price; a model without a price is served and counted unpriced). Budgets are those of the current window; refusals are this gateway's since it started.`),
    h("div", { class: "toolbar" }, period),
    h("div", { class: "two" },
      h("section", { class: "panel", id: "spend-totals" }, h("h2", {}, "Totals"),
        h("dl", { class: "facts" },
          h("dt", {}, "Cost"), h("dd", { id: "total-cost" }, money(total("cost"))),
          h("dt", {}, "Requests"), h("dd", { id: "total-requests" }, String(total("requests"))),
          h("dt", {}, "Unpriced"), h("dd", { id: "total-unpriced" }, unpriced(total("unpriced"))),
          h("dt", {}, "Refused (budget, 402)"), h("dd", { id: "budget-refused" }, String(budgetRefused)),
          h("dt", {}, "Refused (rate limit, 429)"), h("dd", { id: "rate-refused" }, String(rateRefused)))),
      h("section", { class: "panel", id: "refusals" }, h("h2", {}, "Refusals"), refusals(spend.refused))),
    h("section", { class: "panel", id: "budgets" }, h("h2", {}, "Budgets"), budgets(spend.budgets)),
    spendTable("by-scenario", "By scenario", groupBy(rows, "scenario"), ["Scenario", (r) => scenarioLink(r.scenario)]),
    spendTable("by-key", "By key", groupBy(rows, "key"), ["Key", (r) => h("code", {}, r.key)]),
    spendTable("by-purpose", "By purpose", groupBy(rows, "purpose"), ["Purpose", (r) => badge(r.purpose, r.purpose === "serve" ? "info" : "")]),
    h("section", { class: "panel", id: "by-release" }, h("h2", {}, "By release"), releases(byRelease.data)),
    h("section", { class: "panel", id: "learning-budgets" }, h("h2", {}, "Learning budgets"),
      learningBudgets(spend.learning_budgets || [])),
    h("section", { class: "panel", id: "learning" }, h("h2", {}, "Learning jobs"),
      h("p", { class: "muted" }, "Reef's own spend: what each recent learning job cost (judges, reflection, training minutes) and its gate decision's share."),
      learning(spend.learning || [])));
}
