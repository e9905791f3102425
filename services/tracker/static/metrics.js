// The metric charts panel, shared by the run page (one run) and the compare page (many):
// one div.chart[data-key] per chart, one series per run, plus the key picker
// (input#metric-key + datalist + button#add-metric) that must already be in the page.
import { el, getJSON, seg, withListParam } from "./api.js";
import { renderChart, PALETTE } from "./chart.js";
import { fmtInt } from "./format.js";

export const DEFAULT_KEYS = ["critic/score/mean", "actor/ppo_kl", "actor/entropy",
  "response_length/mean", "perf/mfu/actor"];

const MAX_POINTS = 600;

// root: the #metrics element; runIds: runs to draw; colors: run id → colour.
export function metricsPanel(root, runIds, colors = {}) {
  const grid = root.querySelector(".charts") || root.appendChild(el("div", { class: "charts" }));
  const input = root.querySelector("#metric-key");
  const addBtn = root.querySelector("#add-metric");
  const datalist = root.querySelector("datalist");
  // Charts in display order. The same key may be charted twice on purpose ("adds a chart
  // for any key"), e.g. to keep a copy next to another metric: entries, not a key set.
  const charts = [];          // {key, div}
  const data = new Map();     // run id → {num_steps, downsampled, series}
  let known = [];             // every key any run has, for the datalist

  const colorOf = (id, i) => colors[id] || PALETTE[i % PALETTE.length];
  const keys = () => [...new Set(charts.map((c) => c.key))];

  function addChart(key) {
    const entry = { key, div: el("div", { class: "chart", "data-key": key }) };
    charts.push(entry);
    grid.append(entry.div);
    return entry;
  }

  function draw(entry) {
    const { key } = entry;
    const series = runIds.map((id, i) => {
      const s = data.get(id)?.series?.[key] || { steps: [], values: [] };
      return { id, color: colorOf(id, i), steps: s.steps, values: s.values, min: s.min, max: s.max };
    });
    const infos = runIds.map((id) => data.get(id)).filter(Boolean);
    const downsampled = infos.some((d) => d.downsampled);
    const steps = Math.max(0, ...infos.map((d) => d.num_steps || 0));
    renderChart(entry.div, {
      title: key, series, band: downsampled, legend: runIds.length > 1,
      subtitle: downsampled ? `${fmtInt(steps)} steps, downsampled` : "",
      onRemove: () => remove(entry),
    });
  }

  function remove(entry) {
    const i = charts.indexOf(entry);
    if (i >= 0) charts.splice(i, 1);
    entry.div.remove();
    syncUrl();
    empty();
  }

  // Keep ?keys= in the address bar so a view can be shared as a link.
  function syncUrl() {
    history.replaceState(null, "", withListParam("keys", charts.map((c) => c.key)));
  }

  function empty() {
    const note = grid.querySelector(".empty");
    if (charts.length === 0 && !note) grid.append(el("div", { class: "empty", text: "No metrics yet." }));
    if (charts.length > 0 && note) note.remove();
  }

  // Fetch `which` keys for every run (one request per run), merging into the cache.
  async function load(which) {
    if (which.length === 0) { empty(); return; }
    await Promise.all(runIds.map(async (id) => {
      try {
        const r = await getJSON(`/api/runs/${seg(id)}/metrics`, { keys: which, max_points: MAX_POINTS });
        const prev = data.get(id) || { series: {} };
        data.set(id, { num_steps: r.num_steps, downsampled: r.downsampled,
          series: { ...prev.series, ...Object.fromEntries(which.map((k) => [k, r.series?.[k]])) } });
      } catch { /* banner shown; keep the old data */ }
    }));
    empty();
    for (const c of charts) if (which.includes(c.key)) draw(c);
  }

  async function loadKeys() {
    const lists = await Promise.all(runIds.map((id) =>
      getJSON(`/api/runs/${seg(id)}/metrics/keys`).then((r) => r.keys || []).catch(() => [])));
    known = [...new Set(lists.flat())].sort();
    if (datalist) datalist.replaceChildren(...known.map((k) => el("option", { value: k })));
    return lists;
  }

  async function add(key) {
    key = (key || "").trim();
    if (!key) return;
    addChart(key);
    syncUrl();
    await load([key]);
  }

  const onAdd = () => { add(input.value); input.value = ""; };
  addBtn?.addEventListener("click", onAdd);
  input?.addEventListener("keydown", (ev) => { if (ev.key === "Enter") onAdd(); });

  // Default charts: the default keys every run has.
  const defaults = (lists) => DEFAULT_KEYS.filter((k) => lists.length > 0 && lists.every((l) => l.includes(k)));

  return {
    keys,
    // initial: explicit keys (from ?keys=) or null for the defaults.
    async init(initial) {
      const lists = await loadKeys();
      const chosen = initial ?? defaults(lists);
      chosen.filter((k, i) => k && chosen.indexOf(k) === i).forEach(addChart);
      await load(keys());
    },
    async refresh() {
      // A run with no metrics when the page opened gets its default charts as soon as
      // its first steps arrive.
      const before = known.length;
      const lists = await loadKeys();
      if (before === 0 && charts.length === 0) defaults(lists).forEach(addChart);
      await load(keys());
    },
  };
}
