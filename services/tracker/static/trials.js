// Run page, lower half: task grid (#task-grid), trial browser (#trials) and the
// turn-by-turn trajectory viewer (#trajectory).
import { el, getJSON, seg } from "./api.js";
import { fmtDuration, fmtPct, fmtInt, fmtValue, fmtTime } from "./format.js";

const $ = (sel) => document.querySelector(sel);
const ok = (v) => typeof v === "number" && Number.isFinite(v);

// Pass rate → background: red (0) → amber (0.5) → green (1), pale enough for dark text.
export function rateColor(rate) {
  if (!ok(rate)) return "hsl(220 10% 92%)";
  const r = Math.min(1, Math.max(0, rate));
  const hue = r < 0.5 ? 4 + (40 - 4) * (r / 0.5) : 40 + (135 - 40) * ((r - 0.5) / 0.5);
  return `hsl(${hue.toFixed(0)} 75% ${r < 0.5 ? 86 : 82}%)`;
}

// Message content may be a string or OpenAI-style parts; show the text either way.
function contentText(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map((p) => (typeof p === "string" ? p : p?.text ?? JSON.stringify(p))).join("\n");
  return JSON.stringify(c, null, 2);
}

// Tool arguments arrive as a JSON string; pretty-print when it parses, verbatim otherwise.
function prettyArgs(args) {
  if (typeof args !== "string") return JSON.stringify(args ?? {}, null, 2);
  try { return JSON.stringify(JSON.parse(args), null, 2); } catch { return args; }
}

const rewardText = (r) => (ok(r) ? String(r) : "—");
const rewardClass = (r) => (!ok(r) ? "na" : r >= 1 ? "pass" : r > 0 ? "partial" : "fail");

function fileBlocks(title, cls, files) {
  const entries = Object.entries(files || {});
  if (!entries.length) return null;
  return el("details", { class: cls }, el("summary", { text: `${title} (${entries.length})` }),
    entries.map(([name, text]) => el("div", { class: "file" },
      el("div", { class: "file-name mono", text: name }), el("pre", { text: contentText(text) }))));
}

function renderTurn(t) {
  const resp = t.response || {};
  const calls = resp.tool_calls || [];
  const results = t.tool_results || [];
  const meta = [t.tokens && `${fmtInt(t.tokens.prompt)} → ${fmtInt(t.tokens.completion)} tok`,
    ok(t.duration_s) && fmtDuration(t.duration_s)].filter(Boolean).join(" · ");
  const toolBlocks = [];
  for (let i = 0; i < Math.max(calls.length, results.length); i++) {
    const c = calls[i], r = results[i];
    if (c) {
      toolBlocks.push(el("div", { class: "tool-call" },
        el("span", { class: "tool-name", text: c.name ?? "tool" }), el("pre", { class: "args", text: prettyArgs(c.arguments) })));
    }
    if (r) toolBlocks.push(el("div", { class: "tool-output" }, el("pre", { text: contentText(r.output) })));
  }
  return el("div", { class: "turn", "data-turn": t.index },
    el("div", { class: "turn-head" }, el("b", { text: `Turn ${t.index}` }), el("span", { class: "muted", text: meta })),
    (t.messages || []).map((m) => el("div", { class: "message", "data-role": m.role ?? "unknown" },
      el("span", { class: "role", text: m.role ?? "?" }), el("div", { class: "content", text: contentText(m.content) }))),
    el("div", { class: "assistant" }, el("span", { class: "role", text: "assistant" }),
      el("div", { class: "response", text: contentText(resp.content) }), toolBlocks));
}

function renderTrajectory(box, r, task, trial) {
  const rec = r.trial || {};
  const reward = r.reward ?? rec.reward;
  const d = rec.durations_s || {};
  const facts = [["termination", rec.termination_reason], ["agent", rec.agent],
    ["tokens in / out", rec.tokens ? `${fmtInt(rec.tokens.prompt)} / ${fmtInt(rec.tokens.completion)}` : null],
    ["wall", ok(d.wall) ? fmtDuration(d.wall) : null], ["model", ok(d.model) ? fmtDuration(d.model) : null],
    ["sandbox", ok(d.sandbox) ? fmtDuration(d.sandbox) : null], ["time", rec.time ? fmtTime(rec.time) : null]]
    .filter(([, v]) => v !== null && v !== undefined);
  const parts = [
    el("div", { class: "traj-head" }, el("h3", { text: `${task} · trial ${trial}` }),
      el("span", { class: "k", text: "reward" }),
      el("span", { class: `reward ${rewardClass(reward)}`, text: rewardText(reward) })),
    el("div", { class: "facts" }, facts.map(([k, v]) => el("div", { class: "kv" },
      el("span", { class: "k", text: k }), el("span", { class: "v", text: v })))),
  ];
  if (rec.failure) parts.push(el("pre", { class: "failure", text: contentText(rec.failure) }));
  if (r.found === false) parts.push(el("p", { class: "empty", text: "The run folder is not reachable from the tracker: no trajectory to show." }));
  parts.push(...(r.turns || []).map(renderTurn));
  if (r.found !== false && !(r.turns || []).length) parts.push(el("p", { class: "empty", text: "No turns recorded." }));
  parts.push(fileBlocks("Verifier", "verifier", r.verifier), fileBlocks("Logs", "logs", r.logs));
  box.replaceChildren(...parts.filter(Boolean));
}

export function trialBrowser(base) {
  const grid = $("#task-grid");
  const taskInput = $("#trial-task");
  const reasonSel = $("#trial-reason");
  const tbody = $("#trials tbody");
  const box = $("#trajectory");
  const reasons = new Set();
  let selected = null; // "task\u0000trial" of the open trajectory
  let trajToken = 0;

  function renderGrid(tasks) {
    const active = taskInput.value.trim();
    grid.replaceChildren(...tasks.map((t) => el("div", {
      class: `cell${t.task === active ? " active" : ""}`, "data-task": t.task, "data-pass-rate": t.pass_rate ?? "",
      style: `background:${rateColor(t.pass_rate)}`, tabindex: 0, role: "button",
      title: `${t.task}: ${t.passes}/${t.num_trials} passed, mean reward ${fmtValue(t.mean_reward)}`,
      onclick: () => filterTask(t.task),
      onkeydown: (ev) => { if (ev.key === "Enter") filterTask(t.task); },
    }, el("span", { class: "task-name", text: t.task }),
      el("span", { class: "task-rate", text: `${fmtPct(t.pass_rate)} · ${t.passes ?? "?"}/${t.num_trials ?? "?"}` }))));
    if (!tasks.length) grid.append(el("p", { class: "empty", text: "No tasks (this run has no trials yet)." }));
    $("#trial-tasks")?.replaceChildren(...tasks.map((t) => el("option", { value: t.task })));
  }

  // Clicking the active task again clears the filter.
  const filterTask = (task) => setTask(taskInput.value.trim() === task ? "" : task);

  function setTask(task) {
    if (taskInput.value.trim() !== task) taskInput.value = task;
    for (const c of grid.querySelectorAll(".cell")) c.classList.toggle("active", c.dataset.task === task);
    loadTrials().catch(() => {});
  }

  function renderTrials(r) {
    const list = r.trials || [];
    $("#trials-count").textContent = r.total > list.length ? `${list.length} of ${fmtInt(r.total)}` : fmtInt(r.total ?? list.length);
    tbody.replaceChildren(...list.map((t) => {
      const key = `${t.task}\u0000${t.trial}`;
      const open = () => loadTrajectory(t.task, t.trial);
      return el("tr", { "data-task": t.task, "data-trial": t.trial, tabindex: 0, class: key === selected ? "selected" : null,
        onclick: open, onkeydown: (ev) => { if (ev.key === "Enter") open(); } },
        el("td", { class: "task", text: t.task }),
        el("td", { class: "trial num", text: t.trial }),
        el("td", { class: "num" }, el("span", { class: `reward-pill ${rewardClass(t.reward)}`, text: rewardText(t.reward) })),
        el("td", { class: "reason", text: t.termination_reason ?? "—" }),
        el("td", { class: "wall num", text: fmtDuration(t.durations_s?.wall) }),
        el("td", { class: "tokens num muted", text: t.tokens ? fmtInt((t.tokens.prompt || 0) + (t.tokens.completion || 0)) : "—" }));
    }));
    if (!list.length) tbody.append(el("tr", { class: "empty" }, el("td", { colspan: 6, text: "No trials match." })));
    // Reasons seen while unfiltered feed the dropdown, so it never narrows to itself.
    for (const t of list) if (t.termination_reason) reasons.add(t.termination_reason);
    const have = new Set([...reasonSel.options].map((o) => o.value));
    for (const reason of [...reasons].sort()) {
      if (!have.has(reason)) reasonSel.append(el("option", { value: reason, text: reason }));
    }
  }

  async function loadTasks() {
    const r = await getJSON(`${base}/tasks`);
    renderGrid(r.tasks || []);
  }

  async function loadTrials() {
    const r = await getJSON(`${base}/trials`, { task: taskInput.value.trim(), termination_reason: reasonSel.value, limit: 200 });
    renderTrials(r);
  }

  async function loadTrajectory(task, trial) {
    selected = `${task}\u0000${trial}`;
    for (const tr of tbody.querySelectorAll("tr[data-task]")) {
      tr.classList.toggle("selected", tr.dataset.task === String(task) && tr.dataset.trial === String(trial));
    }
    const token = ++trajToken; // a slow response for an earlier click must not win
    box.replaceChildren(el("p", { class: "empty", text: `Loading ${task} · trial ${trial}…` }));
    try {
      const r = await getJSON(`${base}/trials/${seg(task)}/${seg(trial)}`);
      if (token === trajToken) renderTrajectory(box, r, task, trial);
    } catch {
      if (token === trajToken) box.replaceChildren(el("p", { class: "empty", text: "Could not load this trial." }));
    }
  }

  let typing = null;
  taskInput.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => setTask(taskInput.value.trim()), 300); });
  reasonSel.addEventListener("change", () => loadTrials().catch(() => {}));

  return {
    init: () => Promise.allSettled([loadTasks(), loadTrials()]),
    refresh: () => Promise.allSettled([loadTasks(), loadTrials()]),
  };
}
