// Display formatting shared by every page. Every function accepts null/undefined/NaN
// because the API sends null for anything not (yet) known, and renders it as an em dash.

export const DASH = "—";

const finite = (x) => typeof x === "number" && Number.isFinite(x);
const pad2 = (n) => String(n).padStart(2, "0");

// "850 ms", "12.3 s", "2m 03s", "1h 04m" — coarser as it grows, so columns stay narrow.
export function fmtDuration(s) {
  if (!finite(s)) return DASH;
  const neg = s < 0 ? "-" : "";
  s = Math.abs(s);
  if (s < 1) return `${neg}${Math.round(s * 1000)} ms`;
  if (s < 60) return `${neg}${s.toFixed(1)} s`;
  if (s < 3600) {
    const m = Math.floor(s / 60);
    return `${neg}${m}m ${pad2(Math.floor(s - m * 60))}s`;
  }
  const h = Math.floor(s / 3600);
  return `${neg}${h}h ${pad2(Math.floor((s - h * 3600) / 60))}m`;
}

// Timeline gaps: "+3.2 s". Null (the first mark) has no predecessor.
export function fmtSince(s) {
  return finite(s) ? `+${fmtDuration(s)}` : DASH;
}

// Local wall-clock time, ISO-like so it sorts and reads the same in every locale.
export function fmtTime(iso) {
  if (!iso) return DASH;
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return DASH;
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ` +
    `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

// Only the time of day: used where the date is already obvious (timeline marks).
export function fmtClock(iso) {
  const t = fmtTime(iso);
  return t === DASH ? t : t.slice(11);
}

export function fmtAgo(iso) {
  if (!iso) return "";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  if (!Number.isFinite(s)) return "";
  return s < 0 ? "" : `${fmtDuration(s)} ago`;
}

export function fmtScore(x) {
  return finite(x) ? x.toFixed(3) : DASH;
}

export function fmtPct(x) {
  return finite(x) ? `${Math.round(x * 100)}%` : DASH;
}

export function fmtBytes(n) {
  if (!finite(n)) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(n < 10 ? 2 : 1)} ${units[i]}`;
}

export function fmtInt(n) {
  return finite(n) ? Math.round(n).toLocaleString("en-US") : DASH;
}

// Metric values span 1e-6 (KL) to 1e4 (lengths): 4 significant digits, exponent when tiny/huge.
export function fmtValue(x) {
  if (!finite(x)) return DASH;
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e7)) return x.toExponential(2);
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return String(Number(x.toPrecision(4)));
}

// Axis labels: the tick step decides the precision, so neighbouring labels never collide as
// "0.1, 0.1, 0.1"; large numbers use k/M suffixes to keep the y axis gutter narrow.
export function fmtTick(x, step) {
  const a = Math.abs(x);
  if (a >= 1e6) return `${+(x / 1e6).toFixed(step >= 1e6 ? 0 : 1)}M`;
  if (a >= 1e4) return `${+(x / 1e3).toFixed(step >= 1e3 ? 0 : 1)}k`;
  if (a !== 0 && step < 1e-3) return x.toExponential(1);
  // Fewest decimals that represent the step exactly (0.25 → 2, 0.5 → 1, 5 → 0).
  let decimals = 0;
  while (decimals < 6 && Math.abs(Math.round(step * 10 ** decimals) - step * 10 ** decimals) > 1e-6) decimals++;
  return x.toFixed(decimals);
}
