// Live status: capture queue, activation per scenario, canaries, adapters, jobs.

import { get } from "../api.js";
import { badge, empty, h, idChip, panel, table, time } from "../dom.js";
import { jobsTable } from "./scenario.js";

export const refreshSeconds = 5;

function activationTable(status, scenarios) {
  const names = [...new Set([...Object.keys(status.scenarios), ...scenarios.map((s) => s.name)])].sort();
  if (!names.length) return empty("No scenario is served yet.");
  const heads = new Map(scenarios.map((s) => [s.name, s]));
  return table([
    ["Scenario", (name) => h("a", { href: `#/scenarios/${encodeURIComponent(name)}` }, name)],
    ["State", (name) => (status.scenarios[name] ? badge(status.scenarios[name].state) : badge("not served here", "info"))],
    ["Head", (name) => (heads.get(name) && heads.get(name).head_seq ? [`#${heads.get(name).head_seq} `, idChip(heads.get(name).head_release_id)] : "—")],
    ["Serving", (name) => idChip(status.scenarios[name] && status.scenarios[name].serving_release_id)],
    ["Activated", (name) => time(status.scenarios[name] && status.scenarios[name].activated_at)],
    ["Failures", (name) => String((status.scenarios[name] && status.scenarios[name].failures) || 0), "num"],
    ["Canary", (name) => {
      const canary = status.scenarios[name] && status.scenarios[name].canary;
      if (!canary) return h("span", { class: "muted" }, "none");
      return [h("a", { href: `#/candidates/${canary.candidate_id}` }, idChip(canary.candidate_id)), " ",
        badge(canary.state || "canary", canary.error ? "bad" : "warn"), ` ${Math.round(canary.fraction * 100)}%`,
        canary.error ? h("div", { class: "neg small" }, canary.error) : null];
    }],
    ["Error", (name) => (status.scenarios[name] && status.scenarios[name].error) || "", "text"],
  ], names);
}

function adapters(status) {
  const rows = Object.entries(status.adapters).flatMap(([upstream, loaded]) =>
    Object.entries(loaded).map(([name, inFlight]) => ({ upstream, name, inFlight })));
  if (!rows.length) return empty("No adapters loaded.");
  return table([
    ["Upstream", (r) => r.upstream],
    ["Adapter", (r) => h("code", {}, r.name)],
    ["In flight", (r) => String(r.inFlight), "num"],
  ], rows);
}

export async function render() {
  const [status, scenarios] = await Promise.all([get("reef/status"), get("reef/scenarios")]);
  const jobLists = await Promise.all(scenarios.data.map((s) =>
    get(`reef/scenarios/${encodeURIComponent(s.name)}/jobs`, { limit: 10 })));
  const jobs = jobLists.flatMap((list) => list.data)
    .sort((a, b) => (a.updated_at < b.updated_at ? 1 : -1)).slice(0, 20);
  const capture = status.capture;
  const troubled = capture.dropped_total || capture.failed_total;
  return h("div", {},
    h("h1", {}, "Live status"),
    h("p", { class: "subtitle" }, `Updated ${new Date().toLocaleTimeString()}; refreshes every ${refreshSeconds} s.`),
    h("div", { class: "two" },
      h("section", { class: "panel", id: "capture" }, h("h2", {}, "Capture queue"),
        h("dl", { class: "facts" },
          h("dt", {}, "Durability"), h("dd", {}, capture.durability),
          h("dt", {}, "Queue depth"), h("dd", {}, String(capture.queue_depth)),
          h("dt", {}, "Written"), h("dd", {}, String(capture.written_total)),
          h("dt", {}, "Dropped"), h("dd", {}, badge(String(capture.dropped_total), capture.dropped_total ? "bad" : "good")),
          h("dt", {}, "Failed"), h("dd", {}, badge(String(capture.failed_total), capture.failed_total ? "bad" : "good"))),
        troubled ? h("p", { class: "neg small" }, "Records were lost; see the gateway log.") : null),
      panel("Activation totals", h("dl", { class: "facts" },
        h("dt", {}, "Flips"), h("dd", {}, String(status.flips_total)),
        h("dt", {}, "Staging failures"), h("dd", {}, String(status.failures_total)),
        h("dt", {}, "Canary failures"), h("dd", {}, String(status.canary_failures_total))))),
    h("section", { class: "panel", id: "activation" }, h("h2", {}, "Activation"), activationTable(status, scenarios.data)),
    h("section", { class: "panel", id: "jobs" }, h("h2", {}, "Learning jobs"), jobsTable(jobs, true)),
    panel("Loaded adapters", adapters(status)));
}
