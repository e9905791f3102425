// One run (run.html): header, timeline, validation, metrics, checkpoints, and (via
// trials.js) the task grid, trial browser and trajectory viewer. Live via /api/stream.
import { el, getJSON, seg, subscribe, stateBadge } from "./api.js";
import { fmtDuration, fmtSince, fmtTime, fmtClock, fmtScore, fmtBytes, fmtAgo } from "./format.js";
import { renderChart } from "./chart.js";
import { metricsPanel } from "./metrics.js";
import { trialBrowser } from "./trials.js";

const $ = (sel) => document.querySelector(sel);
// The server routes /runs/{run_id}; the id is the last path segment, URL-encoded.
const runId = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop());
const base = `/api/runs/${seg(runId)}`;
document.title = `runctl · ${runId}`;

// cls goes on the value span: tests read e.g. `#run-header .score` and expect just the number.
const kv = (label, value, cls) => el("div", { class: "kv" },
  el("span", { class: "k", text: label }), el("span", { class: `v ${cls || ""}`.trim(), text: value ?? "—" }));

function renderHeader(run, resolved) {
  const h = $("#run-header");
  const title = el("div", { class: "title-row" },
    el("h1", { text: run.run_id }),
    stateBadge(run.state, "state"),
    run.synthetic ? el("span", { class: "tag synthetic", text: "synthetic" }) : null,
    el("span", { class: "spacer" }),
    el("a", { class: "button", href: `/compare?runs=${encodeURIComponent(run.run_id)}`, text: "compare with…" }));
  const p = run.progress;
  const facts = el("div", { class: "facts" },
    kv("type", run.run_type, "type"),
    kv("score", fmtScore(run.score), "score"),
    kv("team", run.team, "team"),
    kv("project / exp", [run.project_name, run.exp_name].filter(Boolean).join(" / ") || null),
    kv("engine", run.engine, "engine"),
    kv("phase", run.phase, "phase"),
    kv("progress", p ? `${p.done} / ${p.total ?? "?"} ${p.unit || ""}` : run.last_step != null ? `step ${run.last_step}` : null, "progress"),
    kv("submitter", run.submitter, "submitter"),
    kv("submitted", fmtTime(run.submitted_at), "submitted"),
    kv("ended", run.ended_at ? fmtTime(run.ended_at) : null, "ended"),
    kv("duration", fmtDuration(run.duration_s), "duration"),
    kv("updated", fmtAgo(run.updated_at) || fmtTime(run.updated_at), "updated"));
  const parts = [title, facts];
  if (run.error) {
    parts.push(el("div", { id: "run-error", class: "run-error" },
      el("b", { text: [run.error.error_type, run.error.phase && `in ${run.error.phase}`].filter(Boolean).join(" ") || "error" }),
      el("pre", { text: run.error.message ?? "" })));
  }
  const entries = Object.entries(resolved || {});
  if (entries.length) {
    parts.push(el("details", { class: "config" }, el("summary", { text: `Resolved config (${entries.length} keys)` }),
      el("table", { class: "data" }, el("tbody", {}, entries.map(([k, v]) => el("tr", {},
        el("td", { class: "mono", text: k }), el("td", { class: "mono", text: v?.value ?? "" }),
        el("td", { class: "muted", text: v?.layer ?? "" }), el("td", { class: "muted", text: v?.source ?? "" })))))));
  }
  h.replaceChildren(...parts);
}

function renderTimeline(marks) {
  const ol = $("#timeline");
  ol.replaceChildren(...marks.map((m) => {
    const kind = /^(failed|rejected|cancelled)$/.test(m.name) ? "bad" : m.name === "succeeded" ? "ok" : "";
    return el("li", { "data-mark": m.name, class: kind, title: m.detail || "" },
      el("span", { class: "mark-name", text: m.name }),
      el("span", { class: "mark-time", text: fmtClock(m.time), title: fmtTime(m.time) }),
      el("span", { class: "since-prev", text: fmtSince(m.since_prev_s) }),
      m.detail ? el("span", { class: "mark-detail", text: m.detail }) : null);
  }));
  if (!marks.length) ol.append(el("li", { class: "empty", text: "No events yet." }));
}

const ICON = { ok: "✓", warn: "⚠", fatal: "✗", skip: "⊘" };

function renderValidation(v) {
  const sec = $("#validation");
  const verdict = sec.querySelector(".verdict");
  verdict.replaceChildren(v.verdict ? stateBadge(v.verdict) : el("span", { class: "muted", text: "pending" }));
  const checks = v.checks || [];
  sec.querySelector("tbody").replaceChildren(...checks.map((c) => el("tr", { "data-check-id": c.id, class: `sev-${c.severity}` },
    el("td", { class: `icon sev-${c.severity}`, text: ICON[c.severity] || "?", title: c.severity }),
    el("td", { class: "mono", text: c.id }),
    el("td", { class: "cls muted", text: c.cls ?? "" }),
    el("td", { class: "message", text: c.message ?? "" }),
    el("td", { class: "fix", text: c.fix ?? "" }))));
  if (!checks.length) sec.querySelector("tbody").append(el("tr", { class: "empty" }, el("td", { colspan: 5, text: "No checks recorded." })));
}

function renderCheckpoints(cps) {
  const sec = $("#checkpoints");
  sec.querySelector("tbody").replaceChildren(...cps.map((c) => el("tr", { "data-step": c.step },
    el("td", { class: "num", text: c.step }),
    el("td", { class: "eval-score num", text: fmtScore(c.eval_score) }),
    el("td", { class: "eval" }, c.eval_run_id
      ? el("a", { href: `/runs/${seg(c.eval_run_id)}`, title: c.eval_run_id }, stateBadge(c.eval_state || "submitted"))
      : el("span", { class: "muted", text: "—" })),
    el("td", { class: "path mono", text: c.path ?? "", title: c.path ?? "" }),
    el("td", { class: "format", text: c.format ?? "" }),
    el("td", { class: "size num", text: fmtBytes(c.num_bytes) }),
    el("td", { class: "time", text: fmtTime(c.time) }))));
  if (!cps.length) sec.querySelector("tbody").append(el("tr", { class: "empty" }, el("td", { colspan: 7, text: "No checkpoints." })));
  const scored = cps.filter((c) => typeof c.eval_score === "number" && Number.isFinite(c.eval_score))
    .sort((a, b) => a.step - b.step);
  // Runs without checkpoints (inference, evals) would show an empty plot: hide it.
  $("#eval-chart").hidden = cps.length === 0;
  sec.querySelector(".split").classList.toggle("single", cps.length === 0);
  renderChart($("#eval-chart"), { title: "eval score by checkpoint step", height: 180,
    series: [{ id: runId, steps: scored.map((c) => c.step), values: scored.map((c) => c.eval_score) }] });
}

// Each section loads on its own so one failing endpoint leaves the others usable.
const sections = {
  header: () => getJSON(base).then((r) => renderHeader(r.run, r.resolved)),
  timeline: () => getJSON(`${base}/timeline`).then((r) => renderTimeline(r.marks || [])),
  validation: () => getJSON(`${base}/validation`).then(renderValidation),
  checkpoints: () => getJSON(`${base}/checkpoints`).then((r) => renderCheckpoints(r.checkpoints || [])),
};

const metrics = metricsPanel($("#metrics"), [runId]);
const trials = trialBrowser(base);
const keysParam = new URLSearchParams(location.search).get("keys");

const settle = (ps) => Promise.allSettled(ps);
settle([...Object.values(sections).map((f) => f()),
  metrics.init(keysParam !== null ? keysParam.split(",").filter(Boolean) : null),
  trials.init()]);

subscribe([runId], () => {
  // The open trajectory is deliberately not reloaded: it is a finished trial and the
  // reader may be scrolled into it.
  settle([...Object.values(sections).map((f) => f()), metrics.refresh(), trials.refresh()]);
});
