// Scenarios overview: each scenario's head, the release this gateway serves, live state.

import { ApiError, get, remove } from "../api.js";
import { badge, empty, h, idChip, panel, reloadPage, time } from "../dom.js";

function canaryLine(canary) {
  if (!canary) return h("span", { class: "muted" }, "none");
  const share = `${Math.round(canary.fraction * 100)}% of live traffic`;
  return h("span", {}, h("a", { href: `#/candidates/${canary.candidate_id}` }, idChip(canary.candidate_id)),
    " ", badge(canary.state || "canary", "warn"), " ", share);
}

function card(scenario, live) {
  const state = live ? live.state : "not served here";
  const behind = live && scenario.head_release_id && live.serving_release_id !== scenario.head_release_id;
  return h("a", { class: "panel card", href: `#/scenarios/${encodeURIComponent(scenario.name)}`,
    "data-scenario": scenario.name },
  h("div", { class: "panel-head" }, h("h2", {}, scenario.name), badge(state, live ? null : "info")),
  h("dl", { class: "facts" },
    h("dt", {}, "Head"),
    h("dd", {}, scenario.head_seq ? [`#${scenario.head_seq} `, idChip(scenario.head_release_id)] : "no release yet"),
    h("dt", {}, "Serving"),
    h("dd", {}, scenario.serving_release_id ? idChip(scenario.serving_release_id) : "—",
      behind ? [" ", badge("behind head", "warn")] : null),
    h("dt", {}, "Releases"),
    h("dd", {}, String(scenario.releases)),
    h("dt", {}, "Canary"),
    h("dd", {}, canaryLine(live && live.canary)),
    h("dt", {}, "Activated"),
    h("dd", {}, live && live.activated_at ? time(live.activated_at) : "—"),
    live && live.error ? [h("dt", {}, "Error"), h("dd", { class: "neg" }, live.error)] : null));
}

// A scenario the configuration does not name, that never learned (its one release is the
// one its first request created) and is not `default`: most often a misspelled name, so it
// is folded away rather than shown beside the real ones.
function stray(scenario) {
  return !scenario.configured && scenario.name !== "default" && scenario.releases <= 1;
}

// Delete asks once more. The gateway deletes only a scenario that holds nothing (no
// record, candidate, job…); otherwise its 409 says what it holds, shown here.
function deleteControl(scenario) {
  const note = h("div", { class: "small neg", role: "status" });
  const button = h("button", {
    type: "button", class: "secondary", "data-delete": scenario.name,
    title: "Delete this scenario: allowed only when it holds no records, candidates, jobs or learned releases.",
  }, "Delete");
  const cancel = h("button", { type: "button", class: "link", hidden: true }, "Cancel");
  let armed = false;
  const disarm = () => {
    armed = false;
    button.textContent = "Delete";
    button.classList.remove("danger");
    button.disabled = false;
    cancel.hidden = true;
  };
  cancel.addEventListener("click", disarm);
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = `Confirm: delete ${scenario.name}`;
      button.classList.add("danger");
      cancel.hidden = false;
      return;
    }
    button.disabled = true;
    try {
      await remove(`reef/scenarios/${encodeURIComponent(scenario.name)}`);
    } catch (error) {
      if (error instanceof ApiError && error.status !== 404) {
        disarm();
        note.textContent = `Not deleted: ${error.message}`;
        return;
      }
    }
    reloadPage();
  });
  return h("div", { class: "release" }, button, " ", cancel, note);
}

function strays(hidden, status) {
  if (!hidden.length) return null;
  const one = hidden.length === 1;
  const names = one ? "1 scenario" : `${hidden.length} scenarios`;
  const folded = `${names} not in the configuration and never learned (created by a request naming `
    + `${one ? "it" : "them"}, perhaps misspelled) ${one ? "is" : "are"} hidden; `
    + "set server.unknown_scenarios: reject to refuse such names";
  return h("details", { class: "panel", id: "unconfigured" },
    h("summary", {}, folded),
    h("div", { class: "grid" }, hidden.map((item) =>
      h("div", { "data-stray": item.name }, card(item, status.scenarios[item.name]), deleteControl(item)))));
}

export async function render() {
  const [scenarios, status] = await Promise.all([get("reef/scenarios"), get("reef/status")]);
  const capture = status.capture;
  const shown = scenarios.data.filter((item) => !stray(item));
  const hidden = scenarios.data.filter(stray);
  return h("div", {},
    h("h1", {}, "Scenarios"),
    h("p", { class: "subtitle" }, "Every scenario this store knows, what heads its release chain and what this gateway serves."),
    scenarios.data.length
      ? h("div", { class: "grid", id: "scenarios" }, shown.map((item) => card(item, status.scenarios[item.name])))
      : panel(null, empty("No scenarios yet: send a request through the gateway (header x-reef-scenario) and it appears here.")),
    strays(hidden, status),
    panel("Capture",
      h("dl", { class: "facts" },
        h("dt", {}, "Durability"), h("dd", {}, capture.durability),
        h("dt", {}, "Queue depth"), h("dd", {}, String(capture.queue_depth)),
        h("dt", {}, "Records written"), h("dd", {}, String(capture.written_total)),
        h("dt", {}, "Dropped / failed"),
        h("dd", {}, badge(`${capture.dropped_total} / ${capture.failed_total}`,
          capture.dropped_total || capture.failed_total ? "bad" : "good"))),
      h("p", { class: "small" }, h("a", { href: "#/status" }, "Live status →"))));
}
