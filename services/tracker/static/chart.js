// Hand-written SVG line chart (no library: the dashboard must work offline with no build).
// renderChart(div, opts) redraws everything from opts; the div keeps opts so a resize or a
// live refresh just calls it again. The viewBox is sized to the div's width at draw time,
// so text is drawn at 1:1 and only scales (slightly) between redraws.
//
// opts = { title, subtitle?, series: [{ id, label?, color?, steps, values, min?, max? }],
//          band?: bool, legend?: bool, height?, xLabel?, onRemove? }
import { el } from "./api.js";
import { fmtTick, fmtValue, fmtInt } from "./format.js";

export const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed",
  "#0891b2", "#db2777", "#65a30d", "#475569", "#ea580c"];

const M = { top: 10, right: 14, bottom: 24, left: 52 };
const svgEl = (tag, attrs = {}) => el(tag, { ...attrs, svg: true });
const ok = (v) => typeof v === "number" && Number.isFinite(v);

// 1-2-5 steps giving about `count` ticks that cover [lo, hi].
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) return { lo, hi, step: 1, ticks: [lo] };
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw) || 10 * mag;
  const start = Math.floor(lo / step + 1e-9) * step;
  const end = Math.ceil(hi / step - 1e-9) * step;
  const ticks = [];
  for (let t = start; t <= end + step * 1e-6; t += step) ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  return { lo: start, hi: end, step, ticks };
}

// Domain of finite values; a single value (or flat line) gets padding so it sits mid-chart.
function extent(arrays) {
  let lo = Infinity, hi = -Infinity;
  for (const a of arrays) for (const v of a || []) if (ok(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (lo === Infinity) return null;
  if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; return [lo - d, hi + d]; }
  return [lo, hi];
}

// Path through finite points; a null/NaN breaks the line rather than bridging or dropping to 0.
function linePath(steps, values, x, y) {
  let d = "", pen = false, n = 0;
  for (let i = 0; i < steps.length; i++) {
    if (!ok(values[i]) || !ok(steps[i])) { pen = false; continue; }
    d += `${pen ? "L" : "M"}${x(steps[i]).toFixed(1)},${y(values[i]).toFixed(1)}`;
    pen = true; n++;
  }
  return { d, n };
}

// Closed min/max band, one polygon per unbroken run of finite bounds.
function bandPath(steps, lo, hi, x, y) {
  let d = "", seg = [];
  const flush = () => {
    if (seg.length > 1) {
      d += "M" + seg.map((i) => `${x(steps[i]).toFixed(1)},${y(hi[i]).toFixed(1)}`).join("L");
      d += "L" + seg.reverse().map((i) => `${x(steps[i]).toFixed(1)},${y(lo[i]).toFixed(1)}`).join("L") + "Z";
    }
    seg = [];
  };
  for (let i = 0; i < steps.length; i++) (ok(lo[i]) && ok(hi[i]) && ok(steps[i])) ? seg.push(i) : flush();
  flush();
  return d;
}

function lastFinite(values) {
  for (let i = (values || []).length - 1; i >= 0; i--) if (ok(values[i])) return values[i];
  return null;
}

// Index of the step nearest to s among finite points (steps are ascending).
function nearest(steps, values, s) {
  let lo = 0, hi = steps.length - 1;
  while (hi - lo > 1) { const mid = (lo + hi) >> 1; steps[mid] < s ? (lo = mid) : (hi = mid); }
  let best = -1, bestD = Infinity;
  for (let i = Math.max(0, lo - 2); i <= Math.min(steps.length - 1, hi + 2); i++) {
    if (ok(values[i]) && Math.abs(steps[i] - s) < bestD) { best = i; bestD = Math.abs(steps[i] - s); }
  }
  return best;
}

const resizeObserved = new WeakSet();
const optsOf = new WeakMap();

export function renderChart(div, opts) {
  optsOf.set(div, opts);
  div.classList.add("chart");
  const series = (opts.series || []).map((s, i) => ({ ...s, color: s.color || PALETTE[i % PALETTE.length] }));
  const W = Math.max(240, Math.round(div.clientWidth || 480));
  const H = opts.height || 200;
  const iw = W - M.left - M.right, ih = H - M.top - M.bottom;

  const head = el("div", { class: "chart-head" },
    el("span", { class: "chart-title", text: opts.title || "" }),
    opts.subtitle ? el("span", { class: "chart-sub", text: opts.subtitle }) : null,
    opts.onRemove ? el("button", { class: "chart-remove", title: "Remove chart", text: "×",
      onclick: opts.onRemove }) : null);
  const legend = (opts.legend ?? series.length > 1) ? el("div", { class: "chart-legend" },
    series.map((s) => el("span", { class: "legend-item", "data-run-id": s.id },
      el("i", { style: `background:${s.color}` }), s.label || s.id))) : null;

  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img",
    "aria-label": opts.title || "chart", preserveAspectRatio: "xMidYMid meet" });
  const steps = series.flatMap((s) => (s.steps || []).filter((_, i) => ok((s.values || [])[i])));
  const xe = extent([steps]);
  const ye = extent(series.flatMap((s) => [s.values, opts.band ? s.min : null, opts.band ? s.max : null]));
  const tip = el("div", { class: "chart-tip", hidden: true });

  if (!xe || !ye) {
    svg.append(svgEl("text", { x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle", text: "no data" }));
  }
  const xt = niceTicks(...(xe || [0, 1]), Math.max(2, Math.round(iw / 90)));
  // x: steps are integers — never show fractional step ticks.
  if (xt.step < 1) { xt.step = 1; xt.ticks = xt.ticks.filter(Number.isInteger); }
  const yt = niceTicks(...(ye || [0, 1]), Math.max(2, Math.round(ih / 40)));
  const x = (s) => M.left + ((s - xt.lo) / (xt.hi - xt.lo || 1)) * iw;
  const y = (v) => M.top + ih - ((v - yt.lo) / (yt.hi - yt.lo || 1)) * ih;

  const axes = svgEl("g", { class: "axes" });
  // With no data the ticks would be invented: draw only the frame and the "no data" note.
  if (!xe || !ye) { xt.ticks = []; yt.ticks = []; }
  for (const t of yt.ticks) {
    axes.append(svgEl("line", { class: "grid", x1: M.left, x2: M.left + iw, y1: y(t), y2: y(t) }),
      svgEl("text", { class: "tick y", x: M.left - 6, y: y(t) + 3.5, "text-anchor": "end", text: fmtTick(t, yt.step) }));
  }
  for (const t of xt.ticks) {
    axes.append(svgEl("line", { class: "tick-mark", x1: x(t), x2: x(t), y1: M.top + ih, y2: M.top + ih + 4 }),
      svgEl("text", { class: "tick x", x: x(t), y: H - 6, "text-anchor": "middle", text: fmtTick(t, xt.step) }));
  }
  axes.append(svgEl("line", { class: "axis", x1: M.left, x2: M.left + iw, y1: M.top + ih, y2: M.top + ih }),
    svgEl("line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: M.top + ih }));
  svg.append(axes);

  const plot = svgEl("g", { class: "plot" });
  for (const s of series) {
    const st = s.steps || [], vals = s.values || [];
    if (opts.band && s.min && s.max && xe && ye) {
      plot.append(svgEl("path", { class: "band", d: bandPath(st, s.min, s.max, x, y), fill: s.color }));
    }
    const { d, n } = xe && ye ? linePath(st, vals, x, y) : { d: "", n: 0 };
    const last = lastFinite(vals);
    plot.append(svgEl("path", { class: "series", d, stroke: s.color, "data-run-id": s.id,
      "data-points": n, "data-last": last === null ? "" : String(last) }));
    // A lone point draws nothing as a path: mark isolated points with a dot.
    if (xe && ye) {
      for (let i = 0; i < st.length; i++) {
        if (ok(vals[i]) && !ok(vals[i - 1]) && !ok(vals[i + 1]) && ok(st[i])) {
          plot.append(svgEl("circle", { class: "point", cx: x(st[i]), cy: y(vals[i]), r: 3, fill: s.color }));
        }
      }
    }
  }
  svg.append(plot);

  const cursor = svgEl("g", { class: "cursor", visibility: "hidden" });
  const vline = svgEl("line", { y1: M.top, y2: M.top + ih });
  const dots = series.map((s) => svgEl("circle", { r: 3.5, fill: s.color }));
  cursor.append(vline, ...dots);
  svg.append(cursor);
  const hit = svgEl("rect", { class: "hit", x: M.left, y: M.top, width: iw, height: ih, fill: "transparent" });
  svg.append(hit);

  if (xe && ye) {
    hit.addEventListener("mousemove", (ev) => {
      const pt = new DOMPoint(ev.clientX, ev.clientY).matrixTransform(svg.getScreenCTM().inverse());
      const s = xt.lo + ((pt.x - M.left) / iw) * (xt.hi - xt.lo);
      const rows = [];
      let at = null;
      series.forEach((ser, k) => {
        const i = nearest(ser.steps || [], ser.values || [], s);
        if (i < 0) { dots[k].setAttribute("visibility", "hidden"); return; }
        at = at ?? ser.steps[i];
        dots[k].setAttribute("visibility", "visible");
        dots[k].setAttribute("cx", x(ser.steps[i]));
        dots[k].setAttribute("cy", y(ser.values[i]));
        rows.push(el("div", { class: "tip-row" }, el("i", { style: `background:${ser.color}` }),
          series.length > 1 ? el("span", { class: "tip-label", text: ser.label || ser.id }) : null,
          el("b", { text: fmtValue(ser.values[i]) }),
          ser.steps[i] !== at ? el("span", { class: "tip-step", text: ` @${fmtInt(ser.steps[i])}` }) : null));
      });
      if (at === null) return;
      vline.setAttribute("x1", x(at)); vline.setAttribute("x2", x(at));
      cursor.setAttribute("visibility", "visible");
      tip.replaceChildren(el("div", { class: "tip-step-head", text: `${opts.xLabel || "step"} ${fmtInt(at)}` }), ...rows);
      tip.hidden = false;
      // Keep the tooltip inside the chart: flip to the left of the cursor past the middle.
      const box = div.getBoundingClientRect();
      const px = ev.clientX - box.left, py = ev.clientY - box.top;
      tip.style.left = px > box.width / 2 ? "" : `${px + 12}px`;
      tip.style.right = px > box.width / 2 ? `${box.width - px + 12}px` : "";
      tip.style.top = `${Math.max(0, py - 10)}px`;
    });
    hit.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); tip.hidden = true; });
  }

  div.replaceChildren(...[head, legend, el("div", { class: "chart-body" }, svg, tip)].filter(Boolean));

  if (!resizeObserved.has(div) && typeof ResizeObserver !== "undefined") {
    resizeObserved.add(div);
    let lastW = W;
    new ResizeObserver(() => {
      const w = div.clientWidth;
      if (w && Math.abs(w - lastW) > 24 && optsOf.get(div)) { lastW = w; renderChart(div, optsOf.get(div)); }
    }).observe(div);
  }
  return div;
}
