// Talking to the tracker, plus the small DOM helper every page builds with.
// Everything the API returns is untrusted text: pages build nodes with el() (textContent),
// never innerHTML, so a task name or a tool output can never inject markup.

// Build an element. attrs: class/className, dataset-style "data-*" keys, on* listeners,
// "text" for textContent; everything else goes through setAttribute (never innerHTML).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElementNS(
    attrs.svg ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml", tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false || k === "svg") continue;
    if (k === "text") node.textContent = String(v);
    else if (k === "class" || k === "className") node.setAttribute("class", v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// Several sections fail independently (e.g. a run without metrics yet); the banner keeps
// one entry per failing endpoint so a later success of one does not hide another's error,
// and folds identical messages (a missing run fails every section the same way).
const errors = new Map(); // endpoint → { message, url }

function renderErrors() {
  let banner = document.getElementById("error");
  if (!banner) {
    banner = el("div", { id: "error", class: "error-banner", role: "alert" });
    document.body.prepend(banner);
  }
  const groups = new Map();
  for (const { message, url } of errors.values()) {
    if (!groups.has(message)) groups.set(message, []);
    groups.get(message).push(url);
  }
  banner.replaceChildren(...[...groups].map(([message, urls]) => el("div", {},
    message, errUrl(urls[0]), urls.length > 1 ? ` (and ${urls.length - 1} more requests)` : "")));
  banner.hidden = errors.size === 0;
}
const errUrl = (u) => (u ? el("span", { class: "error-url", text: ` — ${u}` }) : "");

export function showError(key, message, where = "") {
  errors.set(key, { message, url: where });
  renderErrors();
}

export function clearError(key) {
  if (errors.delete(key)) renderErrors();
}

// Query string from an object, dropping empty values so "all teams" is just an absent param.
export function qs(params = {}) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v === null || v === undefined || v === "") continue;
    p.set(k, Array.isArray(v) ? v.join(",") : String(v));
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

// This page's URL with a comma-list param replaced; commas stay literal so links read
// "?runs=a,b" (URLSearchParams would write "a%2Cb"). An empty list drops the param.
export function withListParam(name, list, path = location.pathname) {
  const p = new URLSearchParams(location.search);
  p.delete(name);
  const parts = [p.toString(), list.length ? `${name}=${list.map(encodeURIComponent).join(",")}` : ""].filter(Boolean);
  return path + (parts.length ? `?${parts.join("&")}` : "");
}

// Path segments (run ids, task names) are user-chosen: always encode them.
export const seg = (s) => encodeURIComponent(String(s));

// The tracker needs a token. A link from `runctl dashboard --open` carries it in its #fragment
// (which the browser never sends in a request): it is exchanged once for a cookie that lasts
// this browser session, and taken out of the address bar. Without one, signIn() asks for it.
async function startSession(token) {
  const resp = await fetch("/api/session", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }),
  });
  return resp.ok;
}

const ready = (async () => {
  const found = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!found) return;
  history.replaceState(null, "", location.pathname + location.search);
  await startSession(decodeURIComponent(found[1]));
})();

function signIn() {
  if (document.getElementById("token-form")) return;
  const input = el("input", { id: "token-input", type: "password", placeholder: "rct_team.… or the admin token",
    autocomplete: "off", size: 48 });
  const note = el("span", { class: "muted", id: "token-note",
    text: "The tracker needs your team's token (RUNCTL_TOKEN, as `runctl team add` printed it)." });
  const form = el("form", { id: "token-form", class: "card token-form" }, note, input,
    el("button", { type: "submit", text: "Sign in" }));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (await startSession(input.value.trim())) location.reload();
    else note.textContent = "That token is no team's and not the admin's: check it and try again.";
  });
  document.querySelector("main")?.prepend(form);
  input.focus();
}

// GET JSON. Non-2xx shows the banner (with FastAPI's "detail" when present) and throws,
// so callers can leave their section as it was instead of rendering garbage.
export async function getJSON(path, params) {
  const url = path + qs(params);
  const key = path; // one banner line per endpoint, whatever the query
  let resp;
  try {
    await ready;
    resp = await fetch(url, { headers: { Accept: "application/json" } });
  } catch (err) {
    showError(key, `Cannot reach the tracker: ${err.message}`, url);
    throw err;
  }
  if (resp.status === 401) {
    signIn();
    throw new Error(`401 ${url}`);
  }
  if (!resp.ok) {
    let detail = resp.statusText;
    try {
      const body = await resp.json();
      if (body && body.detail !== undefined) {
        detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      }
    } catch { /* not JSON: keep the status text */ }
    showError(key, `${resp.status} ${detail}`, url);
    throw new Error(`${resp.status} ${url}`);
  }
  clearError(key);
  return resp.json();
}

// Run fn after `wait` ms of quiet, but at least every `maxWait` ms: a busy run emits
// events continuously, and a pure debounce would then never refresh the page.
export function debounce(fn, wait = 300, maxWait = 2000) {
  let timer = null;
  let first = 0;
  return (...args) => {
    const now = Date.now();
    if (!timer) first = now;
    clearTimeout(timer);
    const delay = Math.max(0, Math.min(wait, first + maxWait - now));
    timer = setTimeout(() => { timer = null; fn(...args); }, delay);
  };
}

// Subscribe to /api/stream. runIds: null for every run, else only events touching them.
// onChange receives the set of event names seen since the last call, so a page can skip
// refetching sections the burst of events cannot have changed.
export function subscribe(runIds, onChange, wait = 300) {
  if (typeof EventSource === "undefined") return () => {};
  const wanted = runIds ? new Set(runIds) : null;
  const url = "/api/stream" + (wanted && wanted.size === 1 ? qs({ run_id: [...wanted][0] }) : "");
  let names = new Set();
  const fire = debounce(() => {
    const seen = names;
    names = new Set();
    onChange(seen);
  }, wait);
  // Opened once the session's token is in place: an EventSource refused (401) never retries.
  let source = null;
  const listen = () => {
    source = new EventSource(url);
    source.addEventListener("persisted", (ev) => {
      let data;
      try { data = JSON.parse(ev.data); } catch { return; }
      const runs = Array.isArray(data.runs) ? data.runs : [];
      if (wanted && runs.length && !runs.some((r) => wanted.has(r))) return;
      for (const n of data.names || []) names.add(n);
      fire();
    });
    // EventSource reconnects by itself; after a reconnect we may have missed events, so
    // refresh once when the connection comes back.
    let wasDown = false;
    const dot = document.getElementById("live");
    source.addEventListener("error", () => { wasDown = true; dot?.classList.add("down"); });
    source.addEventListener("open", () => {
      dot?.classList.remove("down");
      if (wasDown) { wasDown = false; fire(); }
    });
  };
  ready.then(listen);
  window.addEventListener("pagehide", () => source?.close());
  return () => source?.close();
}

// State → badge colour family; unknown states fall back to neutral.
const STATE_CLASS = {
  submitted: "neutral", validated: "info", queued: "neutral", admitted: "info",
  starting: "info", running: "running", succeeded: "ok", failed: "bad",
  rejected: "bad", cancelled: "muted",
};

export function stateBadge(state, cls = "") {
  const s = state || "unknown";
  return el("span", { class: `badge badge-${STATE_CLASS[s] || "neutral"} ${cls}`.trim(), text: s });
}
