// One evaluation of the gate (or `reef eval run`): what was compared, the decision and
// where its evidence came from, every item's scores on both arms and, for gate.episodes,
// every task's episodes side by side (score, stop, turns, tool calls, reason), each
// with its conversation here and a link to its recorded session's trajectory.

import { get } from "../api.js";
import { badge, clip, contentText, count, empty, fill, h, idChip, num, panel, table, time } from "../dom.js";
import { decisionBlock, evidenceBlock, itemDifferences, ruleLine, shadowBlock, suitesTable } from "../gate.js";
import { sessionHref } from "./records.js";

function episodeCell(scenario, episode) {
  if (!episode) return h("span", { class: "muted" }, "—");
  return h("div", { class: "episode" },
    h("strong", {}, num(episode.score, 2)), " ", badge(episode.stop),
    ` ${count(episode.turns, "turn")}, ${count(episode.tool_calls, "tool call")} `,
    episode.session_id
      ? h("a", { href: sessionHref(scenario, episode.session_id), class: "session-link", title: "the recorded session" }, "trajectory")
      : null,
    h("div", { class: "muted small" }, clip(episode.error || episode.reason || "", 200)));
}

function conversation(episode) {
  if (!episode) return h("td", {}, "—");
  return h("td", { class: "conversation" }, (episode.messages || []).map((message) =>
    h("div", { class: ["said", `role-${message.role}`] },
      h("span", { class: "role" }, message.role), " ",
      clip(contentText(message.content), 400),
      (message.tool_calls || []).map((call) => h("div", { class: "call" },
        h("code", { class: "tool" }, (call.function || {}).name || "?"), " ",
        h("code", { class: "args" }, clip((call.function || {}).arguments || "", 200)))))));
}

// Both sides of one task and repeat, loaded when opened.
function sideBySide(evaluationId, row) {
  const box = h("div", {}, "loading…");
  const details = h("details", { class: "small" }, h("summary", {}, "conversations"), box);
  details.addEventListener("toggle", async () => {
    if (!details.open || box.dataset.loaded) return;
    box.dataset.loaded = "1";
    const found = await get(`reef/evaluations/${encodeURIComponent(evaluationId)}/episodes`, { task: row.task });
    const side = (arm) => found.data.find((e) => e.arm === arm && e.repeat === row.repeat);
    fill(box, h("table", { class: "side-by-side" },
      h("thead", {}, h("tr", {}, h("th", {}, "candidate"), h("th", {}, "baseline"))),
      h("tbody", {}, h("tr", {}, conversation(side("candidate")), conversation(side("baseline"))))));
  });
  return details;
}

function episodesTable(evaluation) {
  const rows = new Map();
  for (const episode of evaluation.episodes) {
    const key = `${episode.task_id}\u0000${episode.repeat}`;
    if (!rows.has(key)) rows.set(key, { task: episode.task_id, repeat: episode.repeat });
    rows.get(key)[episode.arm] = episode;
  }
  const scenario = evaluation.scenario;
  return table([
    ["Task", (row) => h("code", {}, row.task)],
    ["Repeat", (row) => String(row.repeat)],
    ["Candidate", (row) => episodeCell(scenario, row.candidate)],
    ["Baseline", (row) => episodeCell(scenario, row.baseline)],
    ["", (row) => sideBySide(evaluation.id, row)],
  ], [...rows.values()], (row) => {
    const c = row.candidate ? row.candidate.score : 0;
    const b = row.baseline ? row.baseline.score : 0;
    return c > b ? "better" : c < b ? "worse" : null;
  });
}

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
    decision && shadowBlock(decision)
      ? h("section", { class: "panel", id: "shadow" }, h("h2", {}, "Shadow evidence"), shadowBlock(decision)) : null,
    decision ? h("section", { class: "panel", id: "evidence" }, h("h2", {}, "Evidence provenance"), evidenceBlock(decision)) : null,
    (evaluation.episodes || []).length
      ? h("section", { class: "panel", id: "episodes" }, h("h2", {}, "Episodes"),
        h("p", { class: "muted small" }, `${(meta.episodes || {}).environment || "?"} environment, ` +
          `${(meta.episodes || {}).tasks ?? "?"} tasks, ${(meta.episodes || {}).repeats ?? "?"} repeats per side`),
        episodesTable(evaluation))
      : null,
    h("section", { class: "panel", id: "items" }, h("h2", {}, "Per-item differences"), itemDifferences(evaluation)));
}
