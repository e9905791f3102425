// Compare page (compare.html): ?runs=a,b[&keys=k1,k2] — the runs' metrics on shared
// charts (one colour per run throughout the page), and their pass rates per task.
import { el, getJSON, seg, subscribe, stateBadge, withListParam } from "./api.js";
import { fmtScore, fmtPct, fmtDuration } from "./format.js";
import { PALETTE } from "./chart.js";
import { metricsPanel } from "./metrics.js";
import { rateColor } from "./trials.js";

const $ = (sel) => document.querySelector(sel);
const params = new URLSearchParams(location.search);
const runIds = [...new Set((params.get("runs") || "").split(",").map((s) => s.trim()).filter(Boolean))];
const colors = Object.fromEntries(runIds.map((id, i) => [id, PALETTE[i % PALETTE.length]]));
const keysParam = params.get("keys");
document.title = `runctl · compare ${runIds.join(", ")}`;

// Navigate to the same view with a different run list (keeps the chosen keys).
const withRuns = (ids) => withListParam("runs", ids);

const swatch = (id) => el("i", { class: "swatch", style: `background:${colors[id]}` });

async function loadRuns() {
  const ul = $("#compare-runs");
  const items = await Promise.all(runIds.map(async (id) => {
    let run = null;
    try { run = (await getJSON(`/api/runs/${seg(id)}`)).run; } catch { /* banner shows it */ }
    return el("li", { "data-run-id": id }, swatch(id),
      el("a", { href: `/runs/${seg(id)}`, class: "mono", text: id }),
      run ? stateBadge(run.state) : el("span", { class: "badge badge-bad", text: "not found" }),
      run ? el("span", { class: "muted", text: [run.team, run.run_type, run.exp_name].filter(Boolean).join(" · ") }) : null,
      run ? el("span", { class: "muted", text: `score ${fmtScore(run.score)} · ${fmtDuration(run.duration_s)}` }) : null,
      el("a", { class: "remove", href: withRuns(runIds.filter((r) => r !== id)), title: "Remove from comparison", text: "×" }));
  }));
  ul.replaceChildren(...items);
  if (!runIds.length) {
    ul.append(el("li", { class: "empty", text: "No runs chosen: tick runs on the runs page, or add run ids above." }));
  }
}

async function loadPassRates() {
  const sec = $("#pass-rates");
  if (!runIds.length) { sec.hidden = true; return; }
  const r = await getJSON("/api/tasks/pass-rates", { run_ids: runIds });
  const tasks = r.tasks || [];
  sec.hidden = tasks.length === 0;
  sec.querySelector("thead").replaceChildren(el("tr", {}, el("th", { text: "Task" }),
    runIds.map((id) => el("th", { class: "num" }, swatch(id), el("span", { class: "mono", text: id })))));
  sec.querySelector("tbody").replaceChildren(...tasks.map((t) => el("tr", { "data-task": t.task },
    el("td", { class: "mono", text: t.task }),
    runIds.map((id) => {
      const c = t.runs?.[id];
      return c
        ? el("td", { class: "num rate", "data-run-id": id, style: `background:${rateColor(c.pass_rate)}`,
          title: `${c.passes}/${c.num_trials} passed`, text: `${fmtPct(c.pass_rate)} (${c.passes}/${c.num_trials})` })
        : el("td", { class: "num muted", "data-run-id": id, text: "—" });
    }))));
}

// The add-run box offers recent run ids; unknown ids are still allowed (they show "not found").
async function setupAddRun() {
  const input = $("#add-run");
  const add = () => {
    const id = input.value.trim();
    if (id && !runIds.includes(id)) location.href = withRuns([...runIds, id]);
  };
  $("#add-run-btn").addEventListener("click", add);
  input.addEventListener("keydown", (ev) => { if (ev.key === "Enter") add(); });
  try {
    const r = await getJSON("/api/runs", { limit: 100 });
    $("#run-ids").replaceChildren(...(r.runs || []).filter((x) => !runIds.includes(x.run_id))
      .map((x) => el("option", { value: x.run_id, text: [x.run_type, x.state].join(" · ") })));
  } catch { /* the datalist is a convenience */ }
}

const metrics = metricsPanel($("#metrics"), runIds, colors);
const settle = (ps) => Promise.allSettled(ps);
settle([loadRuns(), loadPassRates(), setupAddRun(),
  runIds.length ? metrics.init(keysParam !== null ? keysParam.split(",").filter(Boolean) : null) : Promise.resolve()]);

if (runIds.length) {
  subscribe(runIds, () => settle([loadRuns(), loadPassRates(), metrics.refresh()]));
} else {
  $("#metrics").hidden = true;
}
