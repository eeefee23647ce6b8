// aigcq dashboard: live snapshots over SSE (read with fetch, so the token stays a header).
"use strict";

const TOKEN_KEY = "aigcqAdminToken";
// The link `aigcq up` prints carries the token after "#" (never sent to a server nor logged);
// "?token=" works too. Either moves to this tab's sessionStorage, out of the address bar.
const given = new URLSearchParams(location.hash.slice(1)).get("token")
  || new URLSearchParams(location.search).get("token");
if (given) {
  sessionStorage.setItem(TOKEN_KEY, given);
  history.replaceState(null, "", location.pathname);
}
const headers = () => ({ Authorization: "Bearer " + (sessionStorage.getItem(TOKEN_KEY) || "") });
const $ = (sel) => document.querySelector(sel);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function button(label, onClick) {
  const b = el("button", label);
  b.addEventListener("click", onClick);
  return b;
}

function fillTable(selector, rows) {
  const body = $(selector + " tbody");
  body.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    for (const c of cells) {
      const td = el("td");
      td.append(c instanceof Node ? c : String(c));
      tr.append(td);
    }
    return tr;
  }));
}

async function api(method, path) {
  const r = await fetch(path, { method, headers: headers() });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.detail || body.code || "HTTP " + r.status);
  return body;
}

function setStatus(text, bad) {
  const s = $("#status");
  s.textContent = text;
  s.className = bad ? "error" : "muted";
}

const ago = (t) => (t ? Math.max(0, Date.now() / 1000 - t).toFixed(0) + " s ago" : "-");
const TIME = { hour12: false, hour: "2-digit", minute: "2-digit", second: "2-digit" };
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], TIME);
// Timeline times to the millisecond: a task's steps are often milliseconds apart.
const clockMs = (t) => new Date(t * 1000).toLocaleTimeString([], { ...TIME, fractionalSecondDigits: 3 });
const wrap = (text) => el("span", text, "wrap");  // ids: break anywhere
const soft = (text) => el("span", text, "soft");  // lists: break at spaces
const TERMINAL = new Set(["success", "failed", "cancelled"]);
const RETRYABLE = new Set(["failed", "cancelled"]);

// An SVG polyline of `values` scaled to `max`, across a `width` × `height` chart.
function polyline(values, max, width, height, cls, dashed) {
  const poly = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  const step = width / Math.max(1, values.length - 1);
  const top = height - 5, span = height - 15;
  poly.setAttribute("points", values.map((v, i) => `${i * step},${top - (v / Math.max(max, 1e-9)) * span}`).join(" "));
  poly.setAttribute("class", cls);
  poly.setAttribute("fill", "none");
  poly.setAttribute("stroke", "currentColor");
  poly.setAttribute("stroke-width", "2");
  poly.setAttribute("vector-effect", "non-scaling-stroke");
  if (dashed) poly.setAttribute("stroke-dasharray", "6 4");  // visible on overlap
  return poly;
}

// " (NVIDIA L4, 18.2/22.5 GiB free)": an instance's device and VRAM, when its bridge reports them
const gib = (n) => (n / 2 ** 30).toFixed(1);
const device = (i) => !i.device ? "" : !i.vramTotal ? ` (${i.device})`
  : ` (${i.device}, ${gib(i.vramFree || 0)}/${gib(i.vramTotal)} GiB free)`;

// "2: host:8188 busy (…), host:8189 offline" (each instance as its bridge reported it)
const instanceStates = (b) =>
  `${b.instances}` + ((b.instanceStates || []).length
    ? ": " + b.instanceStates.map((i) => `${i.instanceId} ${i.state}${device(i)}`).join(", ") : "");

function renderBridges(bridges) {
  fillTable("#bridges", bridges.map((b) => [
    b.bridgeId,
    !b.online ? "offline" : b.drained ? "drained" : b.running.length ? "busy" : "idle",
    soft(instanceStates(b)), b.free, wrap(b.running.join(" ") || "-"), ago(b.lastHeartbeat), b.failures,
    b.inRotation ? "in" : "out",
    button(b.drained ? "Undrain" : "Drain", () => act("POST",
      `/api/admin/bridges/${encodeURIComponent(b.bridgeId)}/${b.drained ? "undrain" : "drain"}`)),
  ]));
}

const perTarget = (counts) => Object.entries(counts || {}).map(([t, n]) => `${t}: ${n}`).join(", ") || "-";

function renderQueues(queues) {
  fillTable("#queues", queues.map((q) => [
    q.AIGC, q.platform, q.waiting, soft(perTarget(q.inFlight)), soft(perTarget(q.capacity)),
    q.waiting ? q.oldestWaitS + " s" : "-",
  ]));
}

const seconds = (v) => (v === null || v === undefined ? "-" : v + " s");

function renderTrends(trends) {
  const h = trends.history;
  const counts = Math.max(1, ...h.map((p) => Math.max(p.waiting, p.inFlight)));
  const wait = Math.max(1, ...h.map((p) => p.oldestWaitS));
  $("#queue-chart").replaceChildren(
    polyline(h.map((p) => p.waiting), counts, 600, 120, "waiting"),
    polyline(h.map((p) => p.inFlight), counts, 600, 120, "inflight"),
    polyline(h.map((p) => p.oldestWaitS), wait, 600, 120, "oldest", true),
  );
  const last = h[h.length - 1];
  $("#queue-now").textContent = last
    ? `now: ${last.waiting} waiting, ${last.inFlight} in flight, oldest ${last.oldestWaitS} s` +
      ` (peaks ${counts} tasks, ${wait} s)`
    : "";
  const l = trends.latency;
  $("#latency").textContent = `submit → result p50 ${seconds(l.p50)} · p99 ${seconds(l.p99)}` +
    ` (last ${l.tasks} successes)`;
  $("#spend-chart").replaceChildren(
    polyline(h.map((p) => p.spend), Math.max(0.01, ...h.map((p) => p.spend)), 600, 60, "spend"));
}

function renderChart(split) {
  const h = split.history;
  const max = Math.max(1, ...h.map((p) => Math.max(p.internal, p.external)));
  $("#split-chart").replaceChildren(
    polyline(h.map((p) => p.internal), max, 600, 120, "internal"),
    polyline(h.map((p) => p.external), max, 600, 120, "external", true),
  );
  const { internal, external } = split.totals;
  const share = internal + external ? Math.round((100 * internal) / (internal + external)) : 0;
  $("#split-totals").textContent = `internal ${internal} · external ${external}` +
    (internal + external ? ` · ${share}% internal` : "");
}

function renderHealth(health) {
  const badge = $("#health");
  if (!health) { badge.textContent = "no bridge hub"; return; }
  badge.textContent = health.state;
  badge.className = "badge " + health.state;
  $("#health-detail").textContent = `free slots ${health.freeSlots} · degraded ` +
    `${health.degradeCount}× · recovered ${health.recoverCount}×` +
    (health.reason ? ` · ${health.reason}` : "");
  $("#health-history").replaceChildren(...health.history.slice().reverse().map((e) =>
    el("li", `${clock(e.t)} ${e.state}${e.reason ? " — " + e.reason : ""}`)));
}

const FILTERS = { state: "state", client: "backendId", platform: "platform", target: "target" };
let recentTasks = [];

// Each filter offers the values present (and keeps the one chosen while it is absent).
function refreshFilters() {
  for (const [name, field] of Object.entries(FILTERS)) {
    const select = $("#filter-" + name);
    const chosen = select.value;
    const values = new Set(recentTasks.map((t) => t[field] || "-"));
    if (chosen) values.add(chosen);
    select.replaceChildren(select.options[0], ...[...values].sort().map((v) => {
      const o = el("option", v);
      o.value = v;
      return o;
    }));
    select.value = chosen;
  }
}

function renderRecent(recent) {
  recentTasks = recent;
  refreshFilters();
  const shown = recent.filter((t) => Object.entries(FILTERS).every(([name, field]) => {
    const want = $("#filter-" + name).value;
    return !want || (t[field] || "-") === want;
  }));
  $("#filter-count").textContent = `${shown.length} of ${recent.length}`;
  fillTable("#recent", shown.map((t) => {
    const link = el("a", t.taskId);
    link.href = "#";
    link.addEventListener("click", (ev) => { ev.preventDefault(); showTask(t.taskId); });
    return [link, el("span", t.state, "state-" + t.state), t.backendId || "-",
      `${t.AIGC} / ${t.platform}`, t.target || "-", t.attempt, t.seconds,
      t.updated ? clock(t.updated) : "-"];
  }));
}

function renderOverflow(o) {
  if (!o) return;
  const money = (n) => n.toFixed(2);
  fillTable("#overflow", o.targets.length
    ? o.targets.map((r) => [r.target, r.tasks, money(r.cost)])
    : [["-", 0, money(0)]]);
  $("#overflow-total").textContent = `total ${o.totalTasks} tasks · estimated ${money(o.totalCost)}` +
    " (AIGCQ_OVERFLOW_PRICE per accepted task; per process — sum /metrics across processes)";
}

function renderAsynch(a) {
  const panel = $("#asynch-panel");
  panel.hidden = !a;
  if (!a) return;
  if (a.error) {
    $("#asynch-status").textContent = `${a.url}: ${a.error}`;
    $("#asynch-status").className = "error";
    return;
  }
  const counts = Object.entries(a.taskCounts || {}).map(([s, n]) => `${s} ${n}`).join(" · ");
  $("#asynch-status").textContent = `${a.url} · ${counts || "no tasks"}`;
  $("#asynch-status").className = "muted";
  const limit = (rt, cap) => (rt !== null && rt < cap ? rt : cap);
  fillTable("#asynch-models", a.models.map((m) => [
    m.modelName, m.enabled ? "yes" : "no",
    `${m.gateUsed} / ${limit(m.runtimeQueueLimit, m.queueLimit)}`,
    `${m.semaphoreUsed} / ${limit(m.runtimeMaxConcurrency, m.maxConcurrency)} per tenant`,
    `concurrency ${m.runtimeMaxConcurrency ?? "-"} · queue ${m.runtimeQueueLimit ?? "-"}`,
  ]));
  fillTable("#asynch-recent", a.recent.map((t) => [
    t.taskId, t.modelName, t.tenantId || "-", t.state, t.retryCount,
    t.created ? clock(t.created) : "-",
  ]));
}

let snapshots = 0;
function render(s) {
  renderBridges(s.bridges);
  renderQueues(s.queues);
  renderTrends(s.trends);
  renderChart(s.split);
  renderHealth(s.health);
  renderRecent(s.recent);
  renderOverflow(s.overflow);
  renderAsynch(s.asynch);
  document.body.dataset.snapshots = String(++snapshots);
}

async function act(method, path) {
  try {
    await api(method, path);
    setStatus("done: " + path.split("/").slice(-1)[0]);
  } catch (e) {
    setStatus(e.message, true);
  }
}

// "failure: PromptValidation (task): Value 4096 bigger than max", each part in its own span
function failureLine(f) {
  const line = el("p", "failure: ", "error");
  line.id = "task-failure";
  line.append(el("span", f.code || "failed", "failure-code"));
  if (f.class) line.append(" (", el("span", f.class, "failure-class"), ")");
  line.append(": ", el("span", f.message || "-", "failure-message"));
  return line;
}

async function showTask(id) {
  const box = $("#task");
  $("#task-id").value = id;
  let t;
  try {
    t = await api("GET", "/api/tasks/" + encodeURIComponent(id));
  } catch (e) {
    box.replaceChildren(el("p", e.message, "error"));
    return;
  }
  const table = el("table");
  table.id = "timeline";
  table.append(...[["time", "state", "target", "attempt", "note"], ...t.timeline.map((e) =>
    [clockMs(e.t), e.state, e.target || "-", e.attempt, wrap(e.note || "")])].map((cells, i) => {
    const tr = el("tr");
    tr.append(...cells.map((c) => {
      const cell = el(i ? "td" : "th");
      cell.append(c instanceof Node ? c : String(c));
      return cell;
    }));
    return tr;
  }));
  const again = (path) => async () => { await act("POST", path); await showTask(id); };
  const base = "/" + encodeURIComponent(id);
  // Cancel only what still runs; Retry only what failed or was cancelled.
  const actions = [];
  if (!TERMINAL.has(t.state)) actions.push(button("Cancel", again("/api/tasks" + base + "/cancel")));
  if (RETRYABLE.has(t.state)) actions.push(button("Retry", again("/api/admin/tasks" + base + "/retry")));
  const why = [];
  if (t.failure) why.push(failureLine(t.failure));
  box.replaceChildren(
    el("p", `${t.taskId}: ${t.state} (attempt ${t.attempt}, target ${t.target || "-"})`),
    ...why,
    ...actions,
    table,
  );
}

async function stream() {
  for (;;) {
    try {
      const r = await fetch("/api/admin/events", { headers: headers() });
      if (r.status === 401) {
        setStatus("admin token required: open the dashboard link `aigcq up` prints", true);
      } else if (r.ok) {
        setStatus("live");
        await readEvents(r.body.pipeThrough(new TextDecoderStream()).getReader());
      }
    } catch (e) {
      setStatus("disconnected: " + e.message, true);
    }
    await new Promise((done) => setTimeout(done, 2000));
  }
}

async function readEvents(reader) {
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).split("\n").filter((l) => l.startsWith("data: "));
      buffer = buffer.slice(end + 2);
      if (data.length) render(JSON.parse(data.map((l) => l.slice(6)).join("\n")));
    }
  }
}

$("#filters").addEventListener("change", () => renderRecent(recentTasks));
$("#search").addEventListener("submit", (ev) => { ev.preventDefault(); showTask($("#task-id").value.trim()); });
stream();
