// The shell: hash routes to pages, the key prompt, loading and error states.
//
// A page module exports `render(params, query)` → Promise<Node> (and optionally
// `refreshSeconds`); after an action a page dispatches RELOAD_EVENT on window to render
// the route again. <body data-state> is "loading", "ready", "auth" or "error" and
// <body data-route> the route's name and <body data-path> its hash, so tests and people
// can tell what they see.

import { ApiError, AuthRequired, Forbidden, forgetKey, storeKey, storedKey } from "./api.js";
import { RELOAD_EVENT, fill, h } from "./dom.js";
import * as candidate from "./pages/candidate.js";
import * as evaluation from "./pages/evaluation.js";
import * as feedback from "./pages/feedback.js";
import * as overview from "./pages/overview.js";
import * as records from "./pages/records.js";
import * as scenario from "./pages/scenario.js";
import * as session from "./pages/session.js";
import * as spend from "./pages/spend.js";
import * as status from "./pages/status.js";

const ROUTES = [
  { name: "overview", pattern: /^\/$/, page: overview, nav: "overview" },
  { name: "status", pattern: /^\/status$/, page: status, nav: "status" },
  { name: "spend", pattern: /^\/spend$/, page: spend, nav: "spend" },
  { name: "scenario", pattern: /^\/scenarios\/([^/]+)$/, page: scenario, nav: "overview" },
  { name: "records", pattern: /^\/scenarios\/([^/]+)\/records$/, page: records, nav: "overview" },
  { name: "session", pattern: /^\/scenarios\/([^/]+)\/sessions\/([^/]+)$/, page: session, nav: "overview" },
  { name: "feedback", pattern: /^\/scenarios\/([^/]+)\/feedback$/, page: feedback, nav: "overview" },
  { name: "candidate", pattern: /^\/candidates\/([^/]+)$/, page: candidate, nav: "overview" },
  { name: "evaluation", pattern: /^\/evaluations\/([^/]+)$/, page: evaluation, nav: "overview" },
];

const view = document.getElementById("view");
let generation = 0;
let timer = null;

function keyForm(title, text, tone) {
  const input = h("input", {
    type: "password", id: "admin-key", name: "admin-key", autocomplete: "off",
    placeholder: "admin API key", required: true, "aria-label": "admin API key",
  });
  const form = h("form", { class: "key", id: "key-form" }, input,
    h("button", { type: "submit" }, "Open dashboard"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (key) {
      storeKey(key);
      show();
    }
  });
  setTimeout(() => input.focus(), 0);
  return h("section", { class: ["panel", tone] },
    h("h2", {}, title),
    h("p", {}, text),
    h("p", { class: "small muted" },
      "The key stays in this tab's session storage (never in the address or a cookie) and is " +
      "sent as Authorization: Bearer to the gateway's admin API."),
    form);
}

function errorView(error, retry) {
  if (error instanceof AuthRequired) {
    document.body.dataset.state = "auth";
    return keyForm("Admin key needed", error.message, null);
  }
  document.body.dataset.state = "error";
  if (error instanceof Forbidden) {
    return keyForm("This key may not read the admin API (403)",
      `${error.message}. The dashboard needs a key with the admin role.`, "error");
  }
  const status = error instanceof ApiError && error.status ? ` (HTTP ${error.status})` : "";
  return h("section", { class: "panel error", id: "error" },
    h("h2", {}, `Could not load this page${status}`),
    h("p", {}, error.message || String(error)),
    h("button", { type: "button", class: "secondary", onclick: retry }, "Try again"));
}

function route() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, search] = raw.split("?");
  for (const candidateRoute of ROUTES) {
    const match = candidateRoute.pattern.exec(path);
    if (match) {
      const params = match.slice(1).map(decodeURIComponent);
      return { ...candidateRoute, params, query: new URLSearchParams(search || "") };
    }
  }
  return null;
}

function markNav(active) {
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.nav === active);
  }
  document.getElementById("signout").hidden = !storedKey();
}

/** Render the current route; `quiet` keeps the old content while a refresh loads. */
async function show(quiet = false) {
  const mine = ++generation;
  clearTimeout(timer);
  const current = route();
  document.body.dataset.path = location.hash || "#/";
  if (!current) {
    document.body.dataset.route = "missing";
    document.body.dataset.state = "error";
    fill(view, h("section", { class: "panel error" }, h("h2", {}, "No such page"),
      h("p", {}, h("a", { href: "#/" }, "Back to the scenarios"))));
    return;
  }
  markNav(current.nav);
  document.body.dataset.route = current.name;
  if (!quiet) {
    document.body.dataset.state = "loading";
    fill(view, h("p", { class: "muted" }, "Loading…"));
  }
  try {
    const node = await current.page.render(current.params, current.query);
    if (mine !== generation) return;
    fill(view, node);
    const heading = view.querySelector("h1");
    document.title = heading ? `${heading.textContent} · Reef` : "Reef";
    document.body.dataset.state = "ready";
    markNav(current.nav);
    if (current.page.refreshSeconds) {
      timer = setTimeout(() => show(true), current.page.refreshSeconds * 1000);
    }
  } catch (error) {
    if (mine !== generation) return;
    fill(view, errorView(error, () => show()));
    markNav(current.nav);
  }
}

document.getElementById("signout").addEventListener("click", () => {
  forgetKey();
  show();
});
window.addEventListener("hashchange", () => show());
window.addEventListener(RELOAD_EVENT, () => show(true));
show();
