// aigcq dashboard: live snapshots over SSE (read with fetch, so the token stays a header).
"use strict";

const TOKEN_KEY = "aigcqAdminToken";
const query = new URLSearchParams(location.search);
if (query.has("token")) {
  sessionStorage.setItem(TOKEN_KEY, query.get("token"));
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
const clock = (t) => new Date(t * 1000).toLocaleTimeString();

// "2: host:8188 busy, host:8189 offline" (each instance as its bridge reported it)
const instanceStates = (b) =>
  `${b.instances}` + ((b.instanceStates || []).length
    ? ": " + b.instanceStates.map((i) => `${i.instanceId} ${i.state}`).join(", ") : "");

function renderBridges(bridges) {
  fillTable("#bridges", bridges.map((b) => [
    b.bridgeId,
    !b.online ? "offline" : b.drained ? "drained" : b.running.length ? "busy" : "idle",
    instanceStates(b), b.free, b.running.join(" ") || "-", ago(b.lastHeartbeat), b.failures,
    b.inRotation ? "in" : "out",
    button(b.drained ? "Undrain" : "Drain", () => act("POST",
      `/api/admin/bridges/${encodeURIComponent(b.bridgeId)}/${b.drained ? "undrain" : "drain"}`)),
  ]));
}

function renderQueues(queues) {
  fillTable("#queues", queues.map((q) => [
    q.AIGC, q.platform, q.waiting,
    Object.entries(q.inFlight).map(([t, n]) => `${t}: ${n}`).join(", ") || "-",
    q.oldestWaitS + " s",
  ]));
}

function renderChart(split) {
  const svg = $("#split-chart");
  const h = split.history;
  const max = Math.max(1, ...h.map((p) => Math.max(p.internal, p.external)));
  const step = 600 / Math.max(1, h.length - 1);
  const line = (key, cls) => {
    const poly = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    poly.setAttribute("points", h.map((p, i) => `${i * step},${115 - (p[key] / max) * 105}`).join(" "));
    poly.setAttribute("class", cls);
    poly.setAttribute("fill", "none");
    poly.setAttribute("stroke", "currentColor");
    poly.setAttribute("stroke-width", "2");
    if (key === "external") poly.setAttribute("stroke-dasharray", "6 4");  // visible on overlap
    return poly;
  };
  svg.replaceChildren(line("internal", "internal"), line("external", "external"));
  $("#split-totals").textContent =
    `internal ${split.totals.internal} · external ${split.totals.external}`;
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

function renderRecent(recent) {
  fillTable("#recent", recent.map((t) => {
    const link = el("a", t.taskId);
    link.href = "#";
    link.addEventListener("click", (ev) => { ev.preventDefault(); showTask(t.taskId); });
    return [link, el("span", t.state, "state-" + t.state), `${t.AIGC} / ${t.platform}`,
      t.target || "-", t.attempt, t.seconds];
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
    [clock(e.t), e.state, e.target || "-", e.attempt, e.note || ""])].map((cells, i) => {
    const tr = el("tr");
    tr.append(...cells.map((c) => el(i ? "td" : "th", c)));
    return tr;
  }));
  const again = (path) => async () => { await act("POST", path); await showTask(id); };
  const base = "/" + encodeURIComponent(id);
  box.replaceChildren(
    el("p", `${t.taskId}: ${t.state} (attempt ${t.attempt}, target ${t.target || "-"})`),
    button("Cancel", again("/api/tasks" + base + "/cancel")),
    button("Retry", again("/api/admin/tasks" + base + "/retry")),
    table,
  );
}

async function stream() {
  for (;;) {
    try {
      const r = await fetch("/api/admin/events", { headers: headers() });
      if (r.status === 401) {
        setStatus("admin token required: open /dashboard?token=…", true);
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

$("#search").addEventListener("submit", (ev) => { ev.preventDefault(); showTask($("#task-id").value.trim()); });
stream();
