// One evaluation of the gate (or `reef eval run`): what was compared, the decision and
// where its evidence came from, and every item's scores on both arms.

import { get } from "../api.js";
import { badge, empty, h, idChip, panel, time } from "../dom.js";
import { decisionBlock, evidenceBlock, itemDifferences, ruleLine, suitesTable } from "../gate.js";

export async function render([id]) {
  const evaluation = await get(`reef/evaluations/${encodeURIComponent(id)}`, { items: 1 });
  const meta = evaluation.meta || {};
  const cost = meta.cost || {};
  const decision = evaluation.decision;
  return h("div", {},
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Scenarios"), " / ",
      h("a", { href: `#/scenarios/${encodeURIComponent(evaluation.scenario)}` }, evaluation.scenario), " / evaluation"),
    h("h1", {}, "Evaluation ", idChip(evaluation.id), " ",
      evaluation.verdict ? badge(evaluation.verdict) : badge(evaluation.state)),
    panel(null, h("dl", { class: "facts" },
      h("dt", {}, "Candidate"), h("dd", {}, h("a", { href: `#/candidates/${evaluation.candidate_id}` }, idChip(evaluation.candidate_id))),
      h("dt", {}, "Baseline release"), h("dd", {}, idChip(evaluation.baseline_id)),
      h("dt", {}, "By"), h("dd", {}, evaluation.created_by || "—"),
      h("dt", {}, "Started"), h("dd", {}, time(evaluation.created_at)),
      h("dt", {}, "Finished"), h("dd", {}, time(evaluation.finished_at)),
      h("dt", {}, "Suites"), h("dd", {}, (meta.suites || []).map((name) => h("span", { class: "chip" }, name))),
      h("dt", {}, "Cost"), h("dd", {}, `${cost.model_calls ?? "?"} model calls, ${cost.seconds ?? "?"} s`))),
    h("section", { class: "panel", id: "decision" }, h("h2", {}, "Decision"),
      decision ? [decisionBlock(decision), ruleLine(decision.rule), suitesTable(decision)]
        : empty(evaluation.state === "failed" ? "The evaluation failed before a decision." : "Still running.")),
    decision ? h("section", { class: "panel", id: "evidence" }, h("h2", {}, "Evidence provenance"), evidenceBlock(decision)) : null,
    h("section", { class: "panel", id: "items" }, h("h2", {}, "Per-item differences"), itemDifferences(evaluation)));
}
