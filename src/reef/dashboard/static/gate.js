// Rendering the evaluation gate's evidence: the decision, its suites, where their
// references came from (trust, authors, leave-one-author-out), item differences.

import { barChart } from "./charts.js";
import { badge, clip, contentText, empty, h, num, shortId, signed, table } from "./dom.js";

const MAX_ROWS = 300;

/** The gate block of a candidate's or release's evidence, or null. */
export function gateOf(evidence) {
  return evidence && evidence.gate && typeof evidence.gate === "object" ? evidence.gate : null;
}

/** One line of numbers: "candidate 1.000 vs baseline 0.167 · gain +0.833 [0.6, 1.0] · 30 items". */
export function gateNumbers(decision) {
  const overall = decision && decision.overall;
  if (!overall) return null;
  const d = overall.difference;
  return h("span", { class: "gate-numbers" },
    `candidate ${num(overall.candidate_mean)} vs baseline ${num(overall.baseline_mean)} · gain `,
    signed(d.mean), ` [${num(d.low)}, ${num(d.high)}] · ${overall.items} items`);
}

/** Verdict badge, summary numbers and every reason. */
export function decisionBlock(decision) {
  if (!decision) return empty("No decision recorded.");
  return h("div", { class: "decision" },
    h("p", {}, badge(decision.verdict), " ", gateNumbers(decision)),
    h("ul", { class: "reasons" }, (decision.reasons || []).map((reason) => h("li", {}, reason))),
    decision.safety && decision.safety.length
      ? h("div", { class: "panel error" }, h("strong", {}, "Safety findings"),
        h("ul", {}, decision.safety.map((finding) => h("li", {}, finding))))
      : null,
    (decision.missing || []).length
      ? h("div", { class: "missing" }, h("strong", {}, "Evidence still missing"),
        h("ul", {}, decision.missing.map((what) => h("li", {}, what))))
      : null,
    voidLine(decision.voids),
    slicesTable(decision.slices));
}

/** "3 of 40 items void (upstream_error 3)": answers infrastructure failed, never scored. */
export function voidLine(voids) {
  if (!voids || !voids.void) return null;
  const kinds = Object.entries(voids.by_kind || {}).map(([kind, n]) => `${kind} ${n}`).join(", ");
  return h("p", { class: "small" }, `${voids.void} of ${voids.items} items void (${kinds}): not scored for either arm`);
}

/** Each protected slice (gate.protect): items, both means, change, limit and status. */
export function slicesTable(slices) {
  if (!slices || !slices.length) return null;
  return [h("h3", {}, "Protected slices"), table([
    ["Tag", (row) => h("code", {}, row.tag)],
    ["Items", (row) => String(row.items), "num"],
    ["Baseline", (row) => (row.baseline_mean === undefined ? "—" : num(row.baseline_mean)), "num"],
    ["Candidate", (row) => (row.candidate_mean === undefined ? "—" : num(row.candidate_mean)), "num"],
    ["Change", (row) => (row.change === undefined ? "—" : signed(row.change)), "num"],
    ["Limit", (row) => num(row.max_regression), "num"],
    ["Status", (row) => badge(row.status, row.status === "regressed" ? "bad" : row.status === "ok" ? "good" : "warn")],
  ], slices)];
}

/** The evidence as it grew: one row per gate look with its verdict, the paired items
 * of each suite (with its provenance kind), the void items and the gain. */
export function evidenceGrowth(gate) {
  const history = (gate && gate.history) || [];
  if (!history.length) return null;
  const suites = (look) => Object.entries(look.suites || {})
    .map(([name, n]) => h("span", { class: "chip", title: name }, `${suiteLabel(name)} ${n}`));
  return [h("h3", {}, "Evidence over time"), table([
    ["Look", (look) => look.at || "—"],
    ["Verdict", (look) => badge(look.verdict)],
    ["Items", (look) => String(look.items), "num"],
    ["By suite", suites],
    ["Void", (look) => String(look.void || 0), "num"],
    ["Gain", (look) => (look.gain === null || look.gain === undefined ? "—" : signed(look.gain)), "num"],
    ["Low", (look) => (look.low === null || look.low === undefined ? "—" : num(look.low)), "num"],
  ], history)];
}

/** A suite name with its release ids shortened ("regression:…1f2e3d4c"). */
export function suiteLabel(name) {
  return name.replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, (id) => `…${shortId(id)}`);
}

/** The overall row and each suite: items, both means, gain and its interval. */
export function suitesTable(decision) {
  if (!decision || !decision.overall) return empty("No suite was evaluated.");
  const rows = [decision.overall, ...(decision.suites || [])];
  return table([
    ["Suite", (row) => h("code", { title: row.suite }, suiteLabel(row.suite))],
    ["Items", (row) => String(row.items), "num"],
    ["Baseline", (row) => num(row.baseline_mean), "num"],
    ["Candidate", (row) => num(row.candidate_mean), "num"],
    ["Gain", (row) => signed(row.difference.mean), "num"],
    ["Interval", (row) => `[${num(row.difference.low)}, ${num(row.difference.high)}] at ${Math.round(row.difference.confidence * 100)}%`, "num"],
  ], rows, (row) => (row.suite === "overall" ? "highlight" : null));
}

/** The rule's thresholds as "name value" chips. */
export function ruleLine(rule) {
  if (!rule) return null;
  return h("p", { class: "small muted" }, "Rule: ",
    Object.entries(rule).map(([name, value]) => h("span", { class: "chip" },
      `${name} ${value !== null && typeof value === "object" ? JSON.stringify(value) : value}`)));
}

function countChips(counts, emptyText) {
  const entries = Object.entries(counts || {});
  if (!entries.length) return h("span", { class: "muted" }, emptyText);
  return entries.map(([name, count]) => h("span", { class: "chip", title: name }, `${name} ${count}`));
}

function sourcesTable(sources) {
  if (!sources.length) return empty("No current suite was evaluated.");
  return table([
    ["Suite", (row) => h("code", { title: row.suite }, suiteLabel(row.suite))],
    ["Source", (row) => row.source],
    ["Items", (row) => String(row.items), "num"],
    ["By trust", (row) => countChips(row.by_trust, "—")],
    ["Authors", (row) => countChips(row.authors, row.source === "file" ? "the operator's file" : "—")],
  ], sources);
}

function checksTable(checks, failed) {
  return table([
    ["Left out", (row) => h("code", {}, row.author)],
    ["Items removed", (row) => String(row.items_removed), "num"],
    ["Verdict", (row) => badge(row.verdict)],
    ["Items left", (row) => String(row.items_left), "num"],
    ["Gain on items left", (row) => [signed(row.gain), row.low === null || row.low === undefined ? null : ` (low ${num(row.low)})`], "num"],
    ["Why", (row) => clip((row.reasons || []).join("; "), 160), "text"],
  ], checks, (row) => (failed.has(row.author) || row.verdict !== "passed" ? "loss" : "gain"));
}

function checksNote(evidence, below) {
  if (!below) {
    return `Every item is at or above trust ${evidence.min_trust}: the evidence counts as it is, no author is left out.`;
  }
  return "The decision did not pass on all of its evidence, so no author was left out.";
}

/** Where the decision's references came from: the minimum trust, every current suite
 * by source, trust and author, and each leave-one-author-out check (provenance.py). */
export function evidenceBlock(decision) {
  const evidence = decision && decision.evidence;
  if (!evidence || !Array.isArray(evidence.sources)) {
    return empty("No provenance was recorded with this decision (it predates the independence rule).");
  }
  const below = evidence.items_below_min_trust || 0;
  const checks = evidence.leave_one_out || [];
  const failed = new Set(evidence.failed_authors || []);
  return h("div", { class: "provenance" },
    h("dl", { class: "facts" },
      h("dt", {}, "Minimum trust"), h("dd", {}, badge(evidence.min_trust, "info")),
      h("dt", {}, "Items below it"), h("dd", { id: "items-below" }, String(below)),
      failed.size ? [h("dt", {}, "Failed without"), h("dd", {}, [...failed].map((name) => h("code", { class: "chip" }, name)))] : null),
    h("p", { class: "small muted" },
      `Items whose references come from authors below trust ${evidence.min_trust} count only if the rule still ` +
      "holds with any one such author's items left out; the operator's suites count as they are."),
    h("h3", {}, "Sources"),
    h("div", { id: "sources" }, sourcesTable(evidence.sources)),
    h("h3", {}, "Leave one author out"),
    checks.length ? h("div", { id: "leave-one-out" }, checksTable(checks, failed)) : empty(checksNote(evidence, below)));
}

function mean(values) {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

/** Per item: both arms' mean score over repeats, outputs, and candidate − baseline. */
export function pairItems(evaluation) {
  const byKey = new Map();
  for (const result of evaluation.results || []) {
    const entry = byKey.get(result.item) || { key: result.item, suite: result.suite, arms: {} };
    const arm = entry.arms[result.arm] || { scores: [], outputs: [], errors: [] };
    if (result.score !== null && result.score !== undefined) arm.scores.push(result.score);
    arm.outputs.push(result.output);
    if (result.error) arm.errors.push(result.error);
    entry.arms[result.arm] = arm;
    byKey.set(result.item, entry);
  }
  const items = new Map((evaluation.items || []).map((item) => [`${item.suite}/${item.id}`, item]));
  return [...byKey.values()].map((entry) => {
    const base = entry.arms.baseline;
    const cand = entry.arms.candidate;
    const baseline = base ? mean(base.scores) : null;
    const candidate = cand ? mean(cand.scores) : null;
    const diff = baseline !== null && candidate !== null ? candidate - baseline : null;
    return { ...entry, item: items.get(entry.key) || null, baseline, candidate, diff };
  });
}

function question(row) {
  if (!row.item) return "";
  const users = (row.item.messages || []).filter((m) => m.role === "user");
  return users.length ? contentText(users[users.length - 1].content) : "";
}

function answer(arm, score) {
  if (!arm) return h("span", { class: "muted" }, "—");
  const text = arm.errors.length ? `error: ${arm.errors[0]}` : arm.outputs.map((o) => o ?? "").join(" | ");
  return h("span", {}, badge(num(score, 2), score >= 1 ? "good" : score <= 0 ? "bad" : "warn"), " ", clip(text, 120));
}

function itemsTable(rows) {
  return table([
    ["Item", (row) => h("code", { title: row.key }, row.item ? row.item.id : row.key)],
    ["Suite", (row) => h("code", { title: row.suite }, suiteLabel(row.suite))],
    ["Asked", (row) => clip(question(row), 70), "text"],
    ["Reference", (row) => clip(row.item && row.item.reference !== null ? JSON.stringify(row.item.reference) : "", 40), "text"],
    ["Baseline", (row) => answer(row.arms.baseline, row.baseline), "text"],
    ["Candidate", (row) => answer(row.arms.candidate, row.candidate), "text"],
    ["Diff", (row) => signed(row.diff, 2), "num"],
  ], rows.slice(0, MAX_ROWS), (row) => (row.diff > 0 ? "gain" : row.diff < 0 ? "loss" : null));
}

/** Bar chart of candidate − baseline per paired item, then the items whose score changed
 * (regressions first); unchanged and single-arm items (safety probes) fold away. */
export function itemDifferences(evaluation) {
  const rows = pairItems(evaluation);
  if (!rows.length) return empty("No scored answers were stored for this evaluation.");
  const byKey = (a, b) => a.key.localeCompare(b.key);
  const paired = rows.filter((row) => row.diff !== null);
  const changed = paired.filter((row) => row.diff !== 0).sort((a, b) => a.diff - b.diff || byKey(a, b));
  const unchanged = paired.filter((row) => row.diff === 0).sort(byKey);
  const single = rows.filter((row) => row.diff === null).sort(byKey);
  const meanDiff = mean(paired.map((row) => row.diff));
  return h("div", { class: "item-differences" },
    paired.length
      ? barChart([...paired].sort((a, b) => b.diff - a.diff).map((row) => ({
        value: row.diff,
        tip: `${row.key}: ${row.diff > 0 ? "+" : ""}${num(row.diff, 2)} (baseline ${num(row.baseline, 2)} → candidate ${num(row.candidate, 2)})`,
      })), { mean: meanDiff, title: "candidate minus baseline per item" })
      : empty("No item was answered by both arms."),
    h("p", { class: "small muted" },
      `${paired.length} paired items, ${changed.length} changed, mean difference `, signed(meanDiff)),
    changed.length ? h("div", { id: "changed-items" }, itemsTable(changed)) : empty("No item changed its score."),
    unchanged.length
      ? h("details", {}, h("summary", {}, `${unchanged.length} items scored the same on both arms`), itemsTable(unchanged))
      : null,
    single.length
      ? h("details", {}, h("summary", {}, `${single.length} items answered by one arm only (safety probes)`), itemsTable(single))
      : null,
    rows.length > MAX_ROWS ? h("p", { class: "small muted" }, `Each table shows at most ${MAX_ROWS} items.`) : null);
}

// What each provenance of a shadow pair means (evaluation/shadow.py).
const SHADOW_PROVENANCE = [
  ["live", "the live answer has a correction: both answers scored against it"],
  ["judged", "no reference: the blind pairwise judge preferred one answer, or neither"],
];

/** The shadow suite (gate.shadow): the pairs read and what became of them, the suite in
 * all and per provenance (live, judged), and the judge's position check. */
export function shadowBlock(decision) {
  const shadow = decision && decision.evidence && decision.evidence.shadow;
  if (!shadow || typeof shadow !== "object") return null;
  const summaries = shadow.summaries || {};
  const counts = ["pairs", "live", "judged", "void", "unscored"];
  const judge = shadow.judge;
  return h("div", { class: "shadow-evidence" },
    h("dl", { class: "facts", id: "shadow-counts" }, counts.map((name) => [
      h("dt", {}, name), h("dd", { "data-count": name }, String(shadow[name] ?? 0))])),
    h("p", { class: "small muted" },
      "Live requests of the scenario asked again of the candidate after the live answer went out; " +
      "void pairs (an answer or the judge failed) and unscored ones (no reference, no judge) are counted, not scored."),
    table([
      ["Provenance", ([name]) => h("code", {}, name)],
      ["Meaning", ([name]) => (SHADOW_PROVENANCE.find(([kind]) => kind === name) || [null, "every scored pair"])[1], "text"],
      ["Items", ([, row]) => String(row.items), "num"],
      ["Baseline", ([, row]) => num(row.baseline_mean), "num"],
      ["Candidate", ([, row]) => num(row.candidate_mean), "num"],
      ["Gain", ([, row]) => signed(row.difference.mean), "num"],
      ["Interval", ([, row]) => `[${num(row.difference.low)}, ${num(row.difference.high)}]`, "num"],
    ], ["all", "live", "judged"].filter((name) => summaries[name]).map((name) => [name, summaries[name]]),
    ([name]) => `provenance-${name}`),
    shadow.judged_counted === false ? h("p", { class: "small" }, badge("judged: not counted", "warn"), " ", shadow.judged_reason || "") : null,
    judge
      ? h("p", { class: "small", id: "shadow-judge" }, judge.flagged ? badge("judge flagged", "bad") : badge("judge", "info"),
        ` ${judge.model} on ${judge.upstream}: ${judge.checked ?? 0} pairs judged in both orders, ` +
        `${judge.flips ?? 0} flipped (${Math.round((judge.flip_share || 0) * 100)}%)`
        + (judge.reason ? ` — ${judge.reason}` : ""))
      : null);
}
