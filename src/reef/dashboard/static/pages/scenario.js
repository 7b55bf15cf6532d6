// One scenario: learning curve, release chain timeline, candidates, jobs, recent feedback,
// and the newest quarantined feedback.

import { get } from "../api.js";
import { lineChart } from "../charts.js";
import { badge, clip, empty, h, idChip, num, panel, shortDigest, signed, table, time } from "../dom.js";
import { gateNumbers, gateOf } from "../gate.js";
import { quarantineTable, quarantined } from "./feedback.js";
import { feedbackCell, releaseLabel, requestText, responseText, sessionLink } from "./records.js";

const QUARANTINE_ROWS = 5;

function curveView(points, range = [0, 1]) {
  const live = points.filter((p) => p.scored > 0);
  const gated = points.filter((p) => p.gate && p.gate.candidate_mean !== null && p.gate.candidate_mean !== undefined);
  if (!live.length && !gated.length) {
    return empty("No scores yet: the curve appears once releases serve requests that get feedback, or the gate admits a candidate.");
  }
  const values = [...live.map((p) => p.mean_score), ...gated.map((p) => p.gate.candidate_mean)];
  const bySeq = new Map(points.map((p) => [p.seq, p]));
  const chart = lineChart([
    {
      name: "live feedback mean (serve records)",
      points: points.map((p) => ({
        x: p.seq,
        y: p.scored > 0 ? p.mean_score : null,
        tip: `#${p.seq} ${p.operation}: mean ${num(p.mean_score)} over ${p.scored} scores (${p.served} served) · ${p.created_at}`,
      })),
    },
    {
      name: "gate: candidate mean at admission",
      points: points.map((p) => ({
        x: p.seq,
        y: p.gate ? p.gate.candidate_mean ?? null : null,
        tip: p.gate ? `#${p.seq}: gate candidate ${num(p.gate.candidate_mean)} vs baseline ${num(p.gate.baseline_mean)} on ${p.gate.items} items` : "",
      })),
    },
  ], {
    // The scenario's score range (scenarios.<s>.score_range), so a 1–5 scale reads as one.
    yMin: Math.min(range[0], ...values), yMax: Math.max(range[1], ...values),
    xLabel: "release (seq)", yLabel: "score",
    xTickLabel: (seq) => (bySeq.has(seq) ? `#${seq}` : ""), title: "learning curve",
  });
  const rows = [...points].reverse();
  return h("div", { id: "curve" }, chart,
    h("details", {}, h("summary", {}, "Numbers"),
      table([
        ["Release", (p) => `#${p.seq}`],
        ["Operation", (p) => badge(p.operation)],
        ["Created", (p) => time(p.created_at)],
        ["Served", (p) => String(p.served), "num"],
        ["Scored", (p) => String(p.scored), "num"],
        ["Live mean", (p) => num(p.mean_score), "num"],
        ["Gate candidate", (p) => num(p.gate && p.gate.candidate_mean), "num"],
      ], rows)));
}

function components(manifest) {
  return h("div", { class: "components" },
    h("span", { class: "chip", title: "base model" }, `model ${manifest.model.base}`),
    h("span", { class: "chip", title: manifest.model.adapter || "no adapter" }, `adapter ${shortDigest(manifest.model.adapter)}`),
    h("span", { class: "chip", title: manifest.harness || "no harness" }, `harness ${shortDigest(manifest.harness)}`),
    manifest.recipe ? h("span", { class: "chip" }, `recipe ${manifest.recipe}`) : null);
}

function timeline(releases, headId) {
  if (!releases.length) return empty("No releases yet: the first request to the scenario creates release #1.");
  const seqOf = new Map(releases.map((r) => [r.id, r.seq]));
  return h("ol", { class: "timeline", id: "timeline" }, releases.map((release) => {
    const gate = gateOf(release.evidence);
    const decision = gate && gate.decision;
    return h("li", {
      class: [`op-${release.operation}`, release.id === headId ? "head" : null],
      "data-release": release.id, "data-operation": release.operation,
    },
    h("div", { class: "line" },
      h("strong", {}, `#${release.seq}`), badge(release.operation),
      release.id === headId ? badge("head", "info") : null,
      idChip(release.id), h("span", { class: "when" }, time(release.created_at))),
    components(release.manifest),
    h("div", { class: "reason" }, h("span", { class: "muted" }, "by "), release.created_by || "unknown",
      h("span", { class: "muted" }, " — "), clip(release.reason || "no reason given", 140)),
    release.rolled_back_to
      ? h("div", { class: "evidence" }, `components of #${seqOf.get(release.rolled_back_to) ?? "?"} `, idChip(release.rolled_back_to))
      : null,
    decision
      ? h("div", { class: "evidence" }, "gate ", badge(decision.verdict), " ", gateNumbers(decision))
      : null,
    release.candidate_id
      ? h("div", { class: "evidence" }, h("a", { href: `#/candidates/${release.candidate_id}` }, "candidate "), idChip(release.candidate_id),
        gate && gate.evaluation_id ? [" · ", h("a", { href: `#/evaluations/${gate.evaluation_id}` }, "evaluation")] : null)
      : null);
  }));
}

export function candidatesTable(candidates) {
  if (!candidates.length) return empty("No candidates yet: learning jobs propose them from feedback.");
  return table([
    ["Candidate", (c) => h("a", { href: `#/candidates/${c.id}` }, idChip(c.id))],
    ["State", (c) => [badge(c.state),
      // the gate held it for a person: its harness adds contact data (candidate page says why)
      c.evidence && c.evidence.review ? [" ", badge("held for review", "warn")] : null]],
    ["Created", (c) => time(c.created_at)],
    ["Gain", (c) => {
      const decision = gateOf(c.evidence) && gateOf(c.evidence).decision;
      return decision && decision.overall ? signed(decision.overall.difference.mean) : "—";
    }, "num"],
    ["Decision", (c) => {
      const decision = gateOf(c.evidence) && gateOf(c.evidence).decision;
      return clip(decision ? decision.summary : c.reason, 110);
    }, "text"],
  ], candidates, (c) => `candidate-${c.state}`);
}

export function jobsTable(jobs, withScenario) {
  if (!jobs.length) return empty("No learning jobs yet.");
  return table([
    withScenario ? ["Scenario", (j) => h("a", { href: `#/scenarios/${encodeURIComponent(j.scenario)}` }, j.scenario)] : null,
    ["Job", (j) => idChip(j.id)],
    ["Kind", (j) => j.kind],
    ["State", (j) => badge(j.state)],
    ["Progress", (j) => (j.progress === null ? "—" : h("progress", { max: "1", value: String(j.progress), title: `${Math.round(j.progress * 100)}%` }))],
    ["Attempt", (j) => String(j.attempt), "num"],
    // a job's error names the failing item and field: shown whole, so it can be acted on
    ["Message", (j) => (j.error ? h("span", { class: "job-error" }, clip(j.error, 700)) : clip(j.message || "", 100)), "text"],
    ["Candidate", (j) => (j.candidate_id ? h("a", { href: `#/candidates/${j.candidate_id}` }, idChip(j.candidate_id)) : "—")],
    ["Updated", (j) => time(j.updated_at)],
  ].filter(Boolean), jobs);
}

function recentRecords(name, records, seqOf) {
  if (!records.length) return empty("No feedback yet: POST /reef/feedback with a record id to score an answer.");
  return table([
    ["When", (r) => time(r.created_at)],
    ["Release", (r) => releaseLabel(r.release_id, seqOf)],
    ["Session", (r) => sessionLink(name, r.session_id)],
    ["Asked", (r) => clip(requestText(r), 80), "text"],
    ["Answered", (r) => clip(responseText(r), 80), "text"],
    ["Feedback", (r) => feedbackCell(r), "text"],
  ], records);
}

// A distilled scenario's routing on this gateway (docs/distillation.md), or nothing.
function distillLine(row) {
  if (!row) return null;
  const rate = (100 * row.escalation_rate).toFixed(1);
  return h("p", { class: "subtitle", id: "distill" },
    `distill: student share ${row.student_share} · escalation rate ${rate}% · ` +
    `teacher calls ${row.teacher_calls_last_hour} in the last hour`);
}

export async function render([name]) {
  const scenario = encodeURIComponent(name);
  const [releases, candidates, curve, records, jobs, status, held] = await Promise.all([
    get(`reef/scenarios/${scenario}/releases`, { limit: 100 }),
    get(`reef/scenarios/${scenario}/candidates`, { limit: 50 }),
    get(`reef/scenarios/${scenario}/curve`),
    get(`reef/scenarios/${scenario}/records`, { has_feedback: "true", limit: 10 }),
    get(`reef/scenarios/${scenario}/jobs`, { limit: 10 }),
    get("reef/status"),
    quarantined(name, QUARANTINE_ROWS, null),
  ]);
  const live = status.scenarios[name];
  const head = releases.data[0];
  return h("div", {},
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Scenarios"), " / ", name),
    h("h1", {}, name, " ", live ? badge(live.state) : badge("not served here", "info")),
    h("p", { class: "subtitle" },
      head ? [`head #${head.seq} `, idChip(head.id), " · serving ", idChip(live && live.serving_release_id)] : "no release yet",
      live && live.canary ? [" · canary ", h("a", { href: `#/candidates/${live.canary.candidate_id}` }, idChip(live.canary.candidate_id))] : null),
    distillLine(status.distill && status.distill[name]),
    panel("Learning curve", curveView(curve.data, curve.score_range)),
    h("div", { class: "two split" },
      panel("Release chain", timeline(releases.data, head && head.id)),
      h("div", {},
        panel("Candidates", h("div", { id: "candidates" }, candidatesTable(candidates.data))),
        panel("Learning jobs", h("div", { id: "jobs" }, jobsTable(jobs.data, false))))),
    h("section", { class: "panel", id: "recent" },
      h("div", { class: "panel-head" }, h("h2", {}, "Recent feedback"),
        // every record, not only those with feedback (the records page's default)
        h("a", { href: `#/scenarios/${scenario}/records?feedback=`, id: "all-records" }, "All records →")),
      recentRecords(name, records.data, new Map(releases.data.map((r) => [r.id, r.seq])))),
    h("section", { class: "panel", id: "quarantine" },
      h("div", { class: "panel-head" }, h("h2", {}, "Quarantined feedback"),
        h("a", { href: `#/scenarios/${scenario}/feedback`, id: "quarantine-link" },
          held.next_before ? `All quarantined feedback (newest ${QUARANTINE_ROWS} shown) →` : "Quarantined feedback →")),
      held.data.length
        ? quarantineTable(held.data)
        : empty("Nothing quarantined: learning runs hold back feedback that looks like poisoning here, before anything trains on it.")));
}
