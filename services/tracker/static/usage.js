// Usage page (usage.html): what each team and each run used — GPU-hours by role, CPU-hours,
// sandbox-minutes, tokens — from /api/usage, filtered by team and start date (kept in the URL).
import { el, getJSON, seg, subscribe } from "./api.js";
import { fmtInt, fmtTime } from "./format.js";

const $ = (sel) => document.querySelector(sel);
const team = $("#filter-team");
const since = $("#filter-since");
const params = new URLSearchParams(location.search);
team.value = params.get("team") || "";
since.value = params.get("since") || "";

const hours = (x) => Number(x).toFixed(2);
const cells = (u) => [
  el("td", { class: "num gpu-rollout", text: hours(u.gpu_hours.rollout) }),
  el("td", { class: "num gpu-training", text: hours(u.gpu_hours.training) }),
  el("td", { class: "num gpu-eval", text: hours(u.gpu_hours.eval) }),
  el("td", { class: "num cpu", text: hours(u.cpu_hours) }),
  el("td", { class: "num sandbox", text: Number(u.sandbox_minutes).toFixed(1) }),
  el("td", { class: "num tokens", text: fmtInt(u.tokens_generated) }),
];
const USED = ["GPU-h rollout", "GPU-h training", "GPU-h eval", "CPU-h", "Sandbox-min", "Tokens"];
const header = (table, first) => $(`${table} thead`).replaceChildren(el("tr", {},
  ...first.map((name) => el("th", { text: name })), ...USED.map((name) => el("th", { class: "num", text: name }))));
header("#usage-teams", ["Team"]);
header("#usage-runs", ["Run", "Team", "Type"]);
const empty = (span, text) => el("tr", {}, el("td", { colspan: span, class: "empty", text }));

async function load() {
  const query = { team: team.value.trim(), since: since.value };
  let body;
  try { body = await getJSON("/api/usage", query); } catch { return; /* banner shows it */ }
  $("#usage-window").textContent = `${body.since ? "since " + fmtTime(body.since) : "all time"} · until ${fmtTime(body.now)}`;
  $("#usage-teams tbody").replaceChildren(...(body.teams.length
    ? body.teams.map((u) => el("tr", { "data-team": u.team }, el("td", { class: "team", text: u.team }), ...cells(u)))
    : [empty(7, "Nothing used yet.")]));
  $("#usage-runs tbody").replaceChildren(...(body.runs.length
    ? body.runs.map((u) => el("tr", { "data-run-id": u.run_id },
      el("td", {}, el("a", { href: `/runs/${seg(u.run_id)}`, class: "mono", text: u.run_id })),
      el("td", { class: "team", text: u.team }), el("td", { class: "type", text: u.run_type || "" }), ...cells(u)))
    : [empty(9, "No run has used anything yet.")]));
}

function refilter() {
  const p = new URLSearchParams();
  if (team.value.trim()) p.set("team", team.value.trim());
  if (since.value) p.set("since", since.value);
  history.replaceState(null, "", p.toString() ? `?${p}` : location.pathname);
  load();
}
team.addEventListener("change", refilter);
since.addEventListener("change", refilter);

load();
subscribe(null, (names) => {
  if (["run.admitted", "run.succeeded", "run.failed", "run.cancelled", "sandbox.created", "sandbox.destroyed",
    "trial.finished"].some((n) => names.has(n))) load();
});
