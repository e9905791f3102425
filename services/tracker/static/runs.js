// Runs table (index.html): filters, sortable columns, compare picks, live refresh.
import { el, getJSON, seg, subscribe, stateBadge } from "./api.js";
import { fmtDuration, fmtTime, fmtScore, fmtAgo, fmtInt } from "./format.js";

const LIMIT = 100;
const $ = (sel) => document.querySelector(sel);
const filters = { team: $("#filter-team"), state: $("#filter-state"), run_type: $("#filter-type") };
const tbody = $("#runs tbody");
const compareBtn = $("#compare");

// Options come from every run seen so far, not just the current (filtered) page,
// otherwise choosing a team would leave only that team in the team dropdown.
const seen = { team: new Set(), state: new Set(), run_type: new Set() };
const picked = new Set();
let runs = [];
let total = 0;
let offset = 0;
let sort = { key: null, dir: 1 };

// Filters live in the URL so a filtered view survives reloads and can be linked.
const params = new URLSearchParams(location.search);
for (const [k, sel] of Object.entries(filters)) {
  const v = params.get(k);
  if (v) { seen[k].add(v); sel.value = v; }
}

function fillOptions() {
  for (const [k, sel] of Object.entries(filters)) {
    const current = sel.value;
    const have = new Set([...sel.options].map((o) => o.value));
    const add = [...seen[k]].filter((v) => !have.has(v)).sort();
    if (add.length === 0) continue;
    const opts = [...have].filter(Boolean).concat(add).sort();
    sel.replaceChildren(el("option", { value: "", text: "all" }),
      ...opts.map((v) => el("option", { value: v, text: v })));
    sel.value = current;
  }
}

function progressCell(run) {
  const p = run.progress;
  const td = el("td", { class: "progress" });
  if (!p || p.total === null || p.total === undefined) {
    td.textContent = run.last_step !== null && run.last_step !== undefined ? `step ${run.last_step}` : "—";
    return td;
  }
  const frac = p.total > 0 ? Math.min(1, Math.max(0, p.done / p.total)) : 0;
  const done = ["succeeded", "failed", "cancelled", "rejected"].includes(run.state);
  td.append(`${p.done} / ${p.total} ${p.unit || ""}`.trim(),
    el("span", { class: `bar${done ? "" : " live"}`, "aria-hidden": "true" },
      el("span", { class: "fill", style: `width:${(frac * 100).toFixed(1)}%` })));
  return td;
}

function row(run) {
  const id = run.run_id;
  const pick = el("input", { type: "checkbox", class: "compare-pick", value: id, "aria-label": `compare ${id}` });
  pick.checked = picked.has(id);
  pick.addEventListener("change", () => {
    pick.checked ? picked.add(id) : picked.delete(id);
    updateCompare();
  });
  const runCell = el("td", { class: "run" }, el("a", { href: `/runs/${seg(id)}`, text: id }));
  if (run.synthetic) runCell.append(el("span", { class: "tag synthetic", text: "synthetic" }));
  const state = el("td", { class: "state" }, stateBadge(run.state));
  if (run.error?.message) state.title = `${run.error.error_type || "error"}: ${run.error.message}`;
  return el("tr", { "data-run-id": id, class: run.synthetic ? "synthetic" : null },
    el("td", { class: "pick" }, pick),
    runCell,
    el("td", { class: "exp muted", text: [run.project_name, run.exp_name].filter(Boolean).join(" / ") }),
    el("td", { class: "team", text: run.team ?? "—" }),
    el("td", { class: "type", text: run.run_type ?? "—" }),
    state,
    el("td", { class: "phase muted", text: run.phase ?? "" }),
    progressCell(run),
    el("td", { class: "started", text: fmtTime(run.submitted_at), title: fmtAgo(run.submitted_at) }),
    el("td", { class: "duration num", text: fmtDuration(run.duration_s) }),
    el("td", { class: "score num", text: fmtScore(run.score) }),
    el("td", { class: "submitter muted", text: run.submitter ?? "" }));
}

const sortValue = (r, key) => (key === "progress" ? (r.progress ? r.progress.done / (r.progress.total || 1) : -1) : r[key]);

function render() {
  let list = runs;
  if (sort.key) {
    list = [...runs].sort((a, b) => {
      const va = sortValue(a, sort.key), vb = sortValue(b, sort.key);
      if (va === vb) return 0;
      if (va === null || va === undefined) return 1; // blanks last whatever the direction
      if (vb === null || vb === undefined) return -1;
      return (va < vb ? -1 : 1) * sort.dir;
    });
  }
  tbody.replaceChildren(...list.map(row));
  if (list.length === 0) {
    tbody.append(el("tr", { class: "empty" }, el("td", { colspan: 12, text: "No runs match." })));
  }
  $("#runs-count").textContent = `${fmtInt(total)}`;
  for (const th of document.querySelectorAll("#runs th[data-sort]")) {
    th.classList.toggle("sorted", th.dataset.sort === sort.key);
    th.dataset.dir = th.dataset.sort === sort.key ? (sort.dir > 0 ? "asc" : "desc") : "";
  }
  renderPager();
  updateCompare();
}

function renderPager() {
  const pager = $("#pager");
  if (total <= LIMIT) { pager.replaceChildren(); return; }
  const go = (o) => () => { offset = Math.max(0, o); load(); };
  pager.replaceChildren(
    el("button", { type: "button", text: "‹ Newer", disabled: offset === 0, onclick: go(offset - LIMIT) }),
    el("span", { text: `${offset + 1}–${Math.min(total, offset + LIMIT)} of ${fmtInt(total)}` }),
    el("button", { type: "button", text: "Older ›", disabled: offset + LIMIT >= total, onclick: go(offset + LIMIT) }));
}

function updateCompare() {
  compareBtn.disabled = picked.size === 0;
  compareBtn.textContent = picked.size ? `Compare (${picked.size})` : "Compare";
}

compareBtn.addEventListener("click", () => {
  if (picked.size) location.href = `/compare?runs=${[...picked].map(encodeURIComponent).join(",")}`;
});

async function load() {
  const query = { limit: LIMIT, offset };
  for (const [k, sel] of Object.entries(filters)) query[k] = sel.value;
  try {
    const r = await getJSON("/api/runs", query);
    runs = r.runs || [];
    total = r.total ?? runs.length;
  } catch { return; } // banner is up; keep showing the last good table
  for (const run of runs) {
    if (run.team) seen.team.add(run.team);
    if (run.state) seen.state.add(run.state);
    if (run.run_type) seen.run_type.add(run.run_type);
  }
  fillOptions();
  render();
}

for (const [k, sel] of Object.entries(filters)) {
  sel.addEventListener("change", () => {
    const url = new URL(location.href);
    sel.value ? url.searchParams.set(k, sel.value) : url.searchParams.delete(k);
    history.replaceState(null, "", url);
    offset = 0;
    load();
  });
}

for (const th of document.querySelectorAll("#runs th[data-sort]")) {
  th.addEventListener("click", () => {
    sort = sort.key === th.dataset.sort ? { key: sort.key, dir: -sort.dir } : { key: th.dataset.sort, dir: 1 };
    render();
  });
}

fillOptions();
load();
subscribe(null, () => load());
