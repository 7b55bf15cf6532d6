// One candidate: the gate's decision and where its evidence came from (and a decided
// canary's, the same way), the feedback
// screening of the learning job that made it, its harness against its parent release's,
// the training metrics (loss curves), and the evaluation item by item.

import { get, getOrNull } from "../api.js";
import { lineChart } from "../charts.js";
import { badge, empty, h, idChip, panel, shortDigest, table, time } from "../dom.js";
import { diffLines, diffView, harnessLines } from "../diff.js";
import { decisionBlock, evidenceBlock, evidenceGrowth, gateOf, itemDifferences, ruleLine, shadowBlock, suitesTable } from "../gate.js";

const MAX_CHARTS = 4;
// The screening rules (learning/screening.py), in the order the docs give them.
const SCREENING_RULES = [
  ["repeated_correction", "one correction repeated across many different inputs"],
  ["contradicts_suite", "contradicts a trusted suite's reference for a near-identical input"],
  ["burst", "one author supplying more than its share of a batch"],
  ["planted_instruction", "planted instructions or URLs in the text or correction"],
];

/** Flatten nested metrics to [path, value] pairs ("0:sft.loss_curve", [..]). */
function flatten(value, prefix, out) {
  if (value !== null && typeof value === "object" && !Array.isArray(value)) {
    for (const [key, item] of Object.entries(value)) flatten(item, prefix ? `${prefix}.${key}` : key, out);
  } else {
    out.push([prefix, value]);
  }
  return out;
}

const isSeries = (value) => Array.isArray(value) && value.length >= 2 && value.every((v) => typeof v === "number");

const isPairs = (value) => Array.isArray(value) && value.length > 0
  && value.every((p) => Array.isArray(p) && p.length === 2 && p.every((v) => typeof v === "number"));

/** A model learner's train and validation losses in one chart, and how its run stopped. */
function convergenceView(name, run) {
  const train = run.loss_curve.map((y, i) => ({ x: i + 1, y, tip: `step ${i + 1}: train ${y}` }));
  const val = run.val_curve.map(([x, y]) => ({ x, y, tip: `step ${x}: validation ${y}` }));
  const verdict = run.undertrained === true
    ? "undertrained: the validation loss was still falling when training stopped — more training would likely help"
    : run.undertrained === false ? "converged on its validation split" : "";
  return h("div", { class: "metric-chart", "data-metric": `${name}.convergence` },
    h("h3", {}, `${name}: train and validation loss`),
    h("p", { class: "stop-reason" },
      `stopped: ${run.stop_reason} after ${run.steps} of ${run.steps_planned} planned steps`
      + (run.best_step ? `, best step ${run.best_step}` : "") + (verdict ? ` — ${verdict}` : "")),
    lineChart([{ name: "train", points: train }, { name: "validation", points: val }],
      { width: 460, height: 220, xLabel: "step", yLabel: "loss", title: `${name} loss` }));
}

function trainingView(evidence) {
  const metrics = evidence && evidence.metrics;
  if (!metrics || !Object.keys(metrics).length) {
    return empty("No training metrics: this candidate was not made by a learning job, or its learners reported none.");
  }
  const runs = Object.entries(metrics).filter(([, run]) => run && isSeries(run.loss_curve) && isPairs(run.val_curve));
  const pairs = flatten(metrics, "", []);
  const seen = new Set();
  const series = pairs.filter(([, value]) => {
    if (!isSeries(value)) return false;
    const key = JSON.stringify(value);
    if (seen.has(key)) return false; // learners often report the same curve twice
    seen.add(key);
    return true;
  });
  const scalars = pairs.filter(([, value]) => !Array.isArray(value) || !isSeries(value));
  return h("div", { id: "training" },
    runs.map(([name, run]) => convergenceView(name, run)),
    series.slice(0, MAX_CHARTS).map(([name, values]) => h("div", { class: "metric-chart", "data-metric": name },
      h("h3", {}, name),
      lineChart([{ name, points: values.map((y, i) => ({ x: i + 1, y, tip: `step ${i + 1}: ${y}` })) }],
        { width: 460, height: 220, xLabel: "step", yLabel: name.split(".").pop(), title: name }))),
    scalars.length
      ? table([
        ["Metric", ([name]) => h("code", {}, name)],
        ["Value", ([, value]) => (typeof value === "number" ? String(Math.round(value * 1e4) / 1e4) : JSON.stringify(value))],
      ], scalars)
      : null);
}

function screeningView(candidate) {
  const selection = candidate.evidence && candidate.evidence.selection;
  const review = h("a", { href: `#/scenarios/${encodeURIComponent(candidate.scenario)}/feedback`, id: "quarantine-link" },
    "Review quarantined feedback →");
  if (!selection || typeof selection !== "object") {
    const why = candidate.evidence && candidate.evidence.job_id
      ? "Its learning job recorded no selection stats." : "No selection stats: this candidate was not made by a learning job.";
    return [empty(why), h("p", { class: "small" }, review)];
  }
  if (!("quarantined_new" in selection)) {
    return [empty("The learning job recorded no screening counts (it ran before feedback screening)."), h("p", { class: "small" }, review)];
  }
  // a rule added later shows too; a key that is no rule name (text split out of a
  // reason) stays among "Every selection count" only
  const known = new Set(SCREENING_RULES.map(([rule]) => rule));
  const other = Object.keys(selection)
    .filter((key) => key.startsWith("screened:"))
    .map((key) => key.slice("screened:".length))
    .filter((rule) => /^[a-z_]+$/.test(rule) && !known.has(rule))
    .map((rule) => [rule, ""]);
  const rules = [...SCREENING_RULES, ...other];
  const count = (key) => Number(selection[key] || 0);
  return h("div", { id: "screening-counts" },
    h("dl", { class: "facts" },
      h("dt", {}, "Quarantined by this run"), h("dd", { "data-count": "quarantined_new" }, String(count("quarantined_new"))),
      h("dt", {}, "Held from earlier runs"), h("dd", { "data-count": "quarantined_held" }, String(count("quarantined_held")))),
    table([
      ["Rule", ([rule]) => h("code", {}, rule)],
      ["Flags", ([, what]) => what, "text"],
      ["Rows", ([rule]) => h("span", { "data-count": `screened:${rule}` }, String(count(`screened:${rule}`))), "num"],
    ], rules, ([rule]) => (count(`screened:${rule}`) ? "loss" : null)),
    h("p", { class: "small muted" },
      "Counted over the feedback this run screened (authors below the recipe's selection.screening.exempt_trust, " +
      "operator by default); a row flagged by several rules counts under each. " +
      "Quarantined feedback was neither trained on nor used as gate evidence."),
    h("p", { class: "small" }, review),
    h("details", {}, h("summary", {}, "Every selection count"),
      table([
        ["Count", ([name]) => h("code", {}, name)],
        ["Value", ([, value]) => String(value), "num"],
      ], Object.entries(selection).sort(([a], [b]) => a.localeCompare(b)))));
}

/** The learning job ``jobId`` of ``scenario`` (among its newest), or null. */
async function jobOf(scenario, jobId) {
  try {
    const jobs = await get(`reef/scenarios/${encodeURIComponent(scenario)}/jobs`, { limit: 100 });
    return jobs.data.find((job) => job.id === jobId) || null;
  } catch {
    return null; // a key that may read the candidate but not the jobs: no job panel
  }
}

/** Why the job that proposed a candidate did not get a decision: its stored error. */
function jobFailure(job) {
  if (!job || !job.error) return null;
  const plural = job.attempt === 1 ? "" : "s";
  const again = job.state === "queued" || job.state === "running";
  const what = job.state === "failed" ? `failed after ${job.attempt} attempt${plural}`
    : again ? `is ${job.state} for another attempt; the last one failed` : `${job.state}; its last attempt failed`;
  return h("div", { id: "job-failure", class: "small" },
    h("p", {}, "Its learning job ", idChip(job.id), ` ${what}:`),
    h("pre", { class: "block job-error" }, job.error));
}

function jobFacts(evidence) {
  if (!evidence) return null;
  const facts = [
    ["Recipe", evidence.recipe],
    ["Job", evidence.job_id ? idChip(evidence.job_id) : null],
    ["Records consumed", evidence.consumed],
    ["Trained from", evidence.trained_from ? idChip(evidence.trained_from) : null],
    ["Stale", evidence.stale === undefined ? null : String(evidence.stale)],
  ].filter(([, value]) => value !== null && value !== undefined);
  if (!facts.length) return null;
  return h("dl", { class: "facts" }, facts.map(([name, value]) => [h("dt", {}, name), h("dd", {}, value)]));
}

function harnessDiff(candidate, parent, mine, theirs) {
  const ours = candidate.manifest.harness;
  const base = parent ? parent.manifest.harness : null;
  if (!ours && !base) return empty("Neither this candidate nor its parent has a harness.");
  if (ours === base) return empty(`Same harness as the parent (${shortDigest(ours)}).`);
  if ((ours && !mine) || (base && !theirs)) {
    return empty("A harness artifact could not be read (it may have been garbage-collected).");
  }
  const entries = diffLines(harnessLines(theirs), harnessLines(mine));
  const added = entries.filter((e) => e.op === "add").length;
  const removed = entries.filter((e) => e.op === "del").length;
  return h("div", { id: "harness-diff" },
    h("p", { class: "small muted" },
      `parent ${shortDigest(base)} → candidate ${shortDigest(ours)}: `,
      h("span", { class: "pos" }, `+${added}`), " ", h("span", { class: "neg" }, `−${removed}`), " lines"),
    diffView(entries));
}

function modelLine(candidate, parent) {
  const model = candidate.manifest.model;
  const changed = parent && parent.manifest.model.adapter !== model.adapter;
  return h("div", { class: "components" },
    h("span", { class: "chip" }, `model ${model.base}`),
    h("span", { class: "chip", title: model.adapter || "no adapter" }, `adapter ${shortDigest(model.adapter)}`),
    changed ? badge("new adapter", "info") : null,
    h("span", { class: "chip", title: candidate.manifest.harness || "no harness" }, `harness ${shortDigest(candidate.manifest.harness)}`));
}

/** Why the gate held this candidate for a person: the contact or personal data its
 * harness adds to its parent's (evaluation/safety.py), one row per finding. */
function reviewHold(evidence) {
  const review = evidence && evidence.review;
  if (!review || typeof review !== "object") return null;
  const findings = Array.isArray(review.findings) ? review.findings : [];
  return h("section", { class: "panel", id: "review-reason" },
    h("h2", {}, "Held for review"),
    h("p", {}, badge("review required", "warn"), " ", String(review.reason || "")),
    review.requested_publish
      ? h("p", { class: "small muted" }, `The recipe asked for publish: ${review.requested_publish}; `
        + "a candidate that adds contact data is never published without a person.")
      : null,
    findings.length
      ? table([
        ["Kind", (f) => h("code", {}, String(f.kind))],
        ["Value", (f) => String(f.text)],
        ["Where", (f) => h("code", {}, String(f.where))],
      ], findings)
      : null);
}

function sideNotes(evidence) {
  const notes = [];
  if (evidence && evidence.abandoned) {
    notes.push(h("p", {}, badge("abandoned"), ` by ${evidence.abandoned.by}: ${evidence.abandoned.reason}`));
  }
  if (evidence && evidence.canary) {
    const canary = evidence.canary;
    notes.push(h("p", {}, badge("canary", "warn"), ` ${Math.round((canary.fraction || 0) * 100)}% of live traffic since `, time(canary.started_at)));
    if (canary.decision) {
      notes.push(h("p", { id: "canary-decision" }, badge(canary.decision), ` by the canary monitor: ${canary.reason || ""}`));
    }
  }
  return notes;
}

/** Where a decided canary's live feedback came from: the gate's provenance structure
 * (canary_monitor.py stores it in evidence.canary.evidence), arms as its suites. */
function canaryEvidence(evidence) {
  const canary = evidence && evidence.canary;
  if (!canary || !canary.evidence) return null;
  return h("section", { class: "panel", id: "canary-evidence" },
    h("h2", {}, "Canary evidence provenance"),
    h("p", { class: "small muted" }, "Live feedback on the canary and head arms, one item per scored record; quarantined feedback is left out."),
    evidenceBlock(canary));
}

/** The gate's shadow suite with its provenance (live, judged), when it had gate.shadow. */
function shadowPanel(decision) {
  const block = shadowBlock(decision);
  return block ? h("section", { class: "panel", id: "shadow" }, h("h2", {}, "Shadow evidence"), block) : null;
}

export async function render([id]) {
  const candidate = await get(`reef/candidates/${encodeURIComponent(id)}`);
  const gate = gateOf(candidate.evidence);
  // a missing artifact (garbage-collected) or evaluation degrades its panel, not the page
  const harness = (digest) => (digest ? getOrNull(`reef/artifacts/${encodeURIComponent(digest)}/harness`) : null);
  const parentPromise = candidate.parent_release_id ? get(`reef/releases/${candidate.parent_release_id}`) : null;
  const [parent, mine, evaluation] = await Promise.all([
    parentPromise,
    harness(candidate.manifest.harness),
    gate && gate.evaluation_id ? getOrNull(`reef/evaluations/${gate.evaluation_id}`, { items: 1 }) : null,
  ]);
  // no decision yet: the job that proposed it may have failed at the gate, and says why
  const job = !gate && candidate.evidence && candidate.evidence.job_id
    ? await jobOf(candidate.scenario, candidate.evidence.job_id) : null;
  const theirs = parent && parent.manifest.harness !== candidate.manifest.harness
    ? await harness(parent.manifest.harness) : null;
  const decision = gate && gate.decision;
  return h("div", {},
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Scenarios"), " / ",
      h("a", { href: `#/scenarios/${encodeURIComponent(candidate.scenario)}` }, candidate.scenario), " / candidate"),
    h("h1", {}, "Candidate ", idChip(candidate.id), " ", badge(candidate.state)),
    h("p", { class: "subtitle" }, `proposed by ${candidate.created_by || "unknown"} `, time(candidate.created_at),
      ` — ${candidate.reason || "no reason given"}`,
      parent ? [" · parent ", `#${parent.seq} `, idChip(parent.id)] : null),
    modelLine(candidate, parent),
    sideNotes(candidate.evidence),
    reviewHold(candidate.evidence),
    h("section", { class: "panel", id: "decision" },
      h("h2", {}, "Decision"),
      gate ? [decisionBlock(decision), ruleLine(decision && decision.rule), h("h3", {}, "Suites"), suitesTable(decision),
        evidenceGrowth(gate),
        gate.cost ? h("p", { class: "small muted" }, `cost: ${gate.cost.model_calls ?? "?"} model calls, ${gate.cost.seconds ?? "?"} s`) : null]
        : [empty(`Not evaluated by the gate yet (state ${candidate.state}).`), jobFailure(job)]),
    shadowPanel(decision),
    decision ? h("section", { class: "panel", id: "evidence" }, h("h2", {}, "Evidence provenance"), evidenceBlock(decision)) : null,
    canaryEvidence(candidate.evidence),
    h("section", { class: "panel", id: "screening" }, h("h2", {}, "Feedback screening"), screeningView(candidate)),
    h("div", { class: "two" },
      panel(parent ? `Harness against parent #${parent.seq}` : "Harness", harnessDiff(candidate, parent, mine, theirs)),
      panel("Training", jobFacts(candidate.evidence), trainingView(candidate.evidence))),
    h("section", { class: "panel", id: "items" },
      h("div", { class: "panel-head" }, h("h2", {}, "Per-item differences"),
        evaluation ? h("a", { href: `#/evaluations/${evaluation.id}` }, "Open evaluation →") : null),
      evaluation ? itemDifferences(evaluation) : empty("No evaluation was stored for this candidate.")));
}
