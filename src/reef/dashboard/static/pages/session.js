// One session as a trajectory: a timeline of its turns along a branch (the main branch,
// where the task ended, unless ?branch= picks another), each with what the request added
// (the user's message, the tool results with the calls they answer), the tools offered,
// the reply with its tool calls, retries and feedback; the session's outcomes on top.

import { get } from "../api.js";
import { badge, clip, count, empty, h, idChip, panel, time } from "../dom.js";
import { feedbackCell, sessionHref } from "./records.js";

const LINKS = {
  start: ["start", "info"],
  continues: ["continues", ""],
  system_changed: ["system prompt changed", "warn"],
  compacted: ["history compacted", "warn"],
};


function callView(call) {
  return h("div", { class: "call" },
    h("code", { class: "tool" }, call.name || "?"),
    h("code", { class: "args" }, clip(call.arguments || "", 200)),
    call.id ? h("span", { class: "muted small" }, ` ${call.id}`) : null);
}

function messageView(message) {
  if (message.role === "tool") return null; // shown with the call it answers
  return h("div", { class: ["said", `role-${message.role}`] },
    h("span", { class: "role" }, message.role), " ",
    clip(message.content || "", 400),
    (message.tool_calls || []).map(callView));
}

function toolResultView(result) {
  const call = result.call;
  return h("div", { class: "said role-tool" },
    h("span", { class: "role" }, "tool result"), " ",
    call ? h("code", { class: "tool" }, call.name) : h("code", {}, result.tool_call_id || "?"),
    " → ", clip(result.content, 400));
}

function replyView(attempt) {
  if (!attempt.reply) return h("div", { class: "said" }, badge(attempt.status), " no reply");
  const calls = attempt.reply.tool_calls || [];
  return h("div", { class: "said role-assistant" },
    h("span", { class: "role" }, calls.length > 1 ? `assistant · ${calls.length} parallel calls` : "assistant"), " ",
    clip(attempt.reply.content || "", 600),
    calls.map(callView));
}

function attemptsView(turn) {
  if (turn.attempts.length < 2) return null;
  return h("details", { class: "small" },
    h("summary", {}, count(turn.retries, "retry", "retries")),
    h("ul", { class: "compact" }, turn.attempts.map((a) =>
      h("li", {}, time(a.created_at), " ", idChip(a.record_id), " ", badge(a.status),
        a.error ? [" ", clip(a.error, 120)] : null))));
}

function turnView(turn, position, recordId) {
  const [label, tone] = LINKS[turn.link] || [turn.link, ""];
  const feedback = turn.attempts.flatMap((a) => a.feedback);
  const tools = (turn.tools || []).map((t) => (t.function ? t.function.name : t.name || t.type));
  return h("li", { class: ["turn", `link-${turn.link}`], "data-turn": turn.id },
    h("div", { class: "line" },
      h("strong", {}, `Turn ${position + 1}`), badge(label, tone),
      idChip(recordId),
      turn.children.length > 1 ? badge(`forks: ${turn.children.length}`, "warn") : null,
      tools.length ? h("span", { class: "muted small" }, `tools: ${tools.join(", ")}`) : null),
    turn.system_changed ? h("div", { class: "small" }, h("span", { class: "muted" }, "system: "), clip(turn.system || "", 200)) : null,
    turn.new_messages.map(messageView),
    turn.tool_results.map(toolResultView),
    replyView(turn.attempts.find((a) => a.record_id === recordId) || turn),
    attemptsView(turn),
    feedback.length ? feedbackCell({ feedback }) : null);
}

function branchLinks(name, sessionId, branches, picked, mainIndex) {
  if (branches.length < 2) return null;
  return h("div", { class: "toolbar", id: "branches" },
    h("span", { class: "muted" }, `${branches.length} branches:`),
    branches.map((branch, index) => {
      const text = `${index + 1}${index === mainIndex ? " (main)" : ""} · ${branch.turns.length} turns`;
      return index === picked ? h("strong", {}, text)
        : h("a", { href: `${sessionHref(name, sessionId)}?branch=${index}` }, text);
    }));
}

export async function render([name, sessionId], query) {
  const body = await get(`reef/scenarios/${encodeURIComponent(name)}/sessions/${encodeURIComponent(sessionId)}`);
  const tree = body.trajectory;
  const turns = new Map(tree.turns.map((t) => [t.id, t]));
  const same = (a, b) => a.turns.join() === b.turns.join() && a.records.join() === b.records.join();
  const mainIndex = tree.main_branch ? tree.branches.findIndex((b) => same(b, tree.main_branch)) : 0;
  const asked = Number.parseInt(query.get("branch") || "", 10);
  const picked = asked >= 0 && asked < tree.branches.length ? asked : mainIndex;
  const branch = tree.branches[picked];
  const calls = tree.turns.reduce((n, t) => n + ((t.reply && t.reply.tool_calls) || []).length, 0);
  const retries = tree.turns.reduce((n, t) => n + t.retries, 0);
  return h("div", {},
    h("p", { class: "crumbs" }, h("a", { href: "#/" }, "Scenarios"), " / ",
      h("a", { href: `#/scenarios/${encodeURIComponent(name)}` }, name), " / ",
      h("a", { href: `#/scenarios/${encodeURIComponent(name)}/records?feedback=` }, "records"), " / session"),
    h("h1", {}, `Session ${sessionId}`),
    h("p", { class: "subtitle", id: "summary" },
      `${count(tree.turns.length, "turn")}, ${count(calls, "tool call")}, ` +
      `${count(retries, "retry", "retries")}, ${count(tree.branches.length, "branch", "branches")}.`),
    tree.outcomes.length ? panel("Outcome", h("div", { id: "outcomes" }, feedbackCell({ feedback: tree.outcomes }))) : null,
    branchLinks(name, sessionId, tree.branches, picked, mainIndex),
    panel(null, branch
      ? h("ol", { class: "timeline trajectory", id: "trajectory" },
        branch.turns.map((id, index) => turnView(turns.get(id), index, branch.records[index])))
      : empty("This session has no turns.")));
}
