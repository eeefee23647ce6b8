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

function tableRow(cells) {
  const tr = el("tr");
  for (const c of cells) {
    const td = el("td");
    td.append(c instanceof Node ? c : String(c));
    tr.append(td);
  }
  return tr;
}

function fillTable(selector, rows) {
  $(selector + " tbody").replaceChildren(...rows.map(tableRow));
}

// `row`, and under it (when `detail` has content) a row of one cell across the table's width.
function withDetail(row, detail) {
  if (!detail.textContent) return [row];
  row.classList.add("has-detail");
  const cell = el("td", undefined, "detail");
  cell.colSpan = row.cells.length;
  cell.append(detail);
  const under = el("tr", undefined, "detail-row");
  under.append(cell);
  return [row, under];
}

// `sent`: a JSON body for the request (none when undefined)
async function api(method, path, sent) {
  const json = sent === undefined ? {} : { "Content-Type": "application/json" };
  const r = await fetch(path, {
    method, headers: { ...headers(), ...json }, body: sent === undefined ? undefined : JSON.stringify(sent),
  });
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
const soft = (text) => el("span", text, "soft");  // lists: break at spaces
const taskId = (id) => el("span", id, "id");  // never broken inside
// Task ids side by side: the line breaks between ids, never inside one.
function ids(list) {
  const box = el("span", undefined, "soft");
  list.forEach((id, i) => box.append(...(i ? [" ", taskId(id)] : [taskId(id)])));
  return box;
}
// "0.4 s", "42 s", "3 min 05 s", "2 h 07 min"
function span(s) {
  const t = Math.max(0, Math.round(s || 0)), pad = (n) => String(n).padStart(2, "0");
  if (s < 10) return `${Math.max(0, s || 0).toFixed(1)} s`;
  if (t < 60) return `${t} s`;
  if (t < 3600) return `${Math.floor(t / 60)} min ${pad(t % 60)} s`;
  return `${Math.floor(t / 3600)} h ${pad(Math.floor(t / 60) % 60)} min`;
}
function taskLink(id) {
  const link = el("a");
  link.append(taskId(id));
  link.href = "#";
  link.addEventListener("click", (ev) => { ev.preventDefault(); showTask(id); });
  return link;
}
// Fill `select` with `values` (sorted), keeping its first option and the value chosen.
function setOptions(select, values) {
  const chosen = select.value;
  const all = new Set(values);
  if (chosen) all.add(chosen);
  select.replaceChildren(select.options[0], ...[...all].sort().map((v) => {
    const o = el("option", v);
    o.value = v;
    return o;
  }));
  select.value = chosen;
}
// "PromptValidation: … bigger than max (task)": why a task failed, as it was recorded
// A failure (the API's `failure`: class, code, message) as every view shows it:
// "PromptValidation (task): Value 4096 bigger than max", each part in its own span
// (empty without a failure).
function reason(f) {
  const line = el("span", undefined, "reason");
  if (!f) return line;
  line.append(el("span", f.code || "failed", "failure-code"));
  if (f.class) line.append(" (", el("span", f.class, "failure-class"), ")");
  line.append(": ", el("span", f.message || "-", "failure-message"));
  return line;
}

// The task panel's line: "failure: " and the reason.
function failureLine(f) {
  const line = el("p", "failure: ", "error");
  line.id = "task-failure";
  line.append(reason(f));
  return line;
}
const TERMINAL = new Set(["success", "failed", "cancelled"]);
const RETRYABLE = new Set(["failed", "cancelled"]);

// " (NVIDIA L4, 18.2/22.5 GiB free)": an instance's device and VRAM, when its bridge reports them
const gib = (n) => (n / 2 ** 30).toFixed(1);
const device = (i) => !i.device ? "" : !i.vramTotal ? ` (${i.device})`
  : ` (${i.device}, ${gib(i.vramFree || 0)}/${gib(i.vramTotal)} GiB free)`;

// Under a bridge's row: "gpu0:8188 busy with <id> (…) · gpu1:8188 offline · running: <ids>"
// (each instance as its bridge reported it; the tasks no instance names, after them).
function bridgeDetail(b) {
  const box = el("span");
  const named = new Set();
  for (const i of b.instanceStates || []) {
    if (box.childNodes.length) box.append(" · ");
    const item = el("span", `${i.instanceId} ${i.state}`);
    if (i.taskId) { named.add(i.taskId); item.append(" with ", taskId(i.taskId)); }
    item.append(device(i));
    box.append(item);
  }
  const others = b.running.filter((id) => !named.has(id));
  if (others.length) box.append(box.childNodes.length ? " · running: " : "running: ", ids(others));
  return box;
}

function renderBridges(bridges) {
  const body = $("#bridges tbody");
  body.replaceChildren(...bridges.flatMap((b) => withDetail(tableRow([
      b.bridgeId,
      !b.online ? "offline" : b.drained ? "drained" : b.running.length ? "busy" : "idle",
      b.instances, b.free, b.running.length, ago(b.lastHeartbeat), b.failures,
      b.inRotation ? "in" : "out",
      button(b.drained ? "Undrain" : "Drain", () => act("POST",
        `/api/admin/bridges/${encodeURIComponent(b.bridgeId)}/${b.drained ? "undrain" : "drain"}`)),
  ]), bridgeDetail(b))));
}

const perTarget = (counts) => Object.entries(counts || {}).map(([t, n]) => `${t}: ${n}`).join(", ") || "-";

// `heldBy`: what holds the queue's work (pauses, budget holds, drains), next to it
function renderQueues(queues) {
  fillTable("#queues", queues.map((q) => [
    q.AIGC, q.platform, q.waiting, soft(perTarget(q.inFlight)), soft(perTarget(q.capacity)),
    q.waiting ? span(q.oldestWaitS) : "-",
    (q.heldBy || []).length ? el("span", q.heldBy.join("; "), "held") : "-",
  ]));
}

// Each project's share of our GPUs (model.json "share"): its minimum, ceiling, weight, and
// what it runs on them now.
function renderShares(shares) {
  const rows = shares || [];
  $("#shares").hidden = !rows.length;
  const num = (v) => (v === null || v === undefined ? "-" : String(v));
  fillTable("#shares", rows.map((s) => [s.AIGC, num(s.min), num(s.max), num(s.weight), s.running]));
}

// The capacity planner's last decision (pools.json): each pool's instances now and wanted,
// why, and the projected spend of waiting, renting and overflowing over its horizon.
function renderPools(view) {
  const pools = (view && view.pools) || [];
  $("#pools").hidden = !pools.length;
  fillTable("#pools", pools.map((p) => [
    p.pool, p.current, p.busy, p.booting, p.desired, (p.stop || []).join(", ") || "-",
    p.reason || "-",
  ]));
  const projected = Object.entries((view && view.projected) || {});
  $("#pools-spend").hidden = !pools.length || !projected.length;
  $("#pools-spend").textContent = pools.length ? `projected over ${view.horizonS} s: ` +
    projected.map(([name, p]) => `${name} ${p.cost} (${p.paidTasks} paid, ${p.misses} late)`)
      .join(" · ") : "";
}

const seconds = (v) => (v === null || v === undefined ? "-" : v + " s");

// The queue now, as the Queues table shows it: the charts' last point and their caption.
function queueNow(s) {
  const inFlight = (q) => Object.values(q.inFlight || {}).reduce((a, b) => a + b, 0);
  return {
    t: s.time,
    waiting: s.queues.reduce((n, q) => n + q.waiting, 0),
    inFlight: s.queues.reduce((n, q) => n + inFlight(q), 0),
    oldestWaitS: Math.max(0, ...s.queues.map((q) => (q.waiting ? q.oldestWaitS : 0))),
  };
}

// Seconds on an axis: in seconds, minutes or hours, whichever reads best up to `max`.
function secondsAxis(max) {
  const [div, unit] = max >= 7200 ? [3600, "hours"] : max >= 120 ? [60, "minutes"] : [1, "seconds"];
  return { div, unit };
}

function renderTrends(s) {
  const now = queueNow(s);
  const points = [...s.trends.history.filter((p) => p.t < now.t), now];
  const from = Math.min(points[0].t, now.t - 60), to = now.t;  // at least a minute
  const series = (name, cls, pick, div = 1) => ({ name, cls, points: points.map((p) => [p.t, pick(p) / div]) });
  drawChart($("#queue-chart"), { unit: "tasks", whole: true, from, to, series: [
    series("waiting", "waiting", (p) => p.waiting),
    series("in flight", "inflight", (p) => p.inFlight),
  ] });
  const wait = secondsAxis(Math.max(...points.map((p) => p.oldestWaitS)));
  drawChart($("#wait-chart"), { unit: `oldest wait, ${wait.unit}`, from, to,
    series: [series("oldest wait", "oldest", (p) => p.oldestWaitS, wait.div)] });
  $("#queue-now").textContent = `now: ${now.waiting} waiting, ${now.inFlight} in flight` +
    (now.waiting ? `, oldest waiting ${span(now.oldestWaitS)}` : "");
  const l = s.trends.latency;
  $("#latency").textContent = `submit → result p50 ${seconds(l.p50)} · p99 ${seconds(l.p99)}` +
    ` (last ${l.tasks} successes)`;
}

function renderSplit(split, time) {
  const h = split.history, b = split.bucketS;
  const from = h.length ? h[0].t : time - 60, to = Math.max(time, h.length ? h.at(-1).t + b : time);
  drawChart($("#split-chart"), { kind: "bars", bucketS: b, unit: `tasks finished per ${b} s`,
    whole: true, from, to, series: ["internal", "external"].map((name) => (
      { name, cls: name, points: h.map((p) => [p.t, p[name]]) })) });
  $("#split-legend").textContent = `(${b} s a bar, the last ${span(h.length * b)}; the last bar is still filling)`;
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
    setOptions($("#filter-" + name), recentTasks.map((t) => t[field] || "-"));
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
  // a failed task's reason on a line of its own, under it
  $("#recent tbody").replaceChildren(...shown.flatMap((t) => withDetail(tableRow([
    taskLink(t.taskId), el("span", t.state, "state-" + t.state), t.backendId || "-",
    soft(`${t.AIGC} / ${t.platform}`), t.target || "-", t.attempt, t.seconds,
    t.updated ? clock(t.updated) : "-",
  ]), reason(t.failure))));
}

// ---- live tasks: a page of what waits and runs now, from /api/admin/live-tasks ----
const LIVE_PAGE = 20;
const LIVE_FILTERS = ["state", "project", "platform", "target"];
let liveOffset = 0, liveLoading = false, liveAgain = false;

// The project, platform and target filters offer the queues' (as the Queues table lists them).
function refreshLiveFilters(queues) {
  setOptions($("#live-project"), queues.map((q) => q.AIGC));
  setOptions($("#live-platform"), queues.map((q) => q.platform));
  setOptions($("#live-target"), queues.flatMap((q) => Object.keys(q.capacity || {})));
}

const filtered = () => LIVE_FILTERS.some((name) => $("#live-" + name).value);

async function loadLive() {
  if (liveLoading) { liveAgain = true; return; }
  liveLoading = true;
  try {
    const query = new URLSearchParams({ offset: liveOffset, limit: LIVE_PAGE });
    for (const name of LIVE_FILTERS) {
      const v = $("#live-" + name).value;
      if (v) query.set(name, v);
    }
    const page = await api("GET", "/api/admin/live-tasks?" + query);
    if (page.total && liveOffset >= page.total) {  // the last page emptied: show the new last
      liveOffset = Math.floor((page.total - 1) / LIVE_PAGE) * LIVE_PAGE;
      liveAgain = true;
    } else {
      renderLive(page);
    }
  } catch (e) {
    $("#live-range").textContent = e.message;
  } finally {
    liveLoading = false;
    if (liveAgain) { liveAgain = false; loadLive(); }
  }
}

// Where a task runs: "br1 / gpu0:8188", "runninghub" (its remote id on hover); "queued"
// while it waits, "backing off" before a retry.
function where(t) {
  if (t.state === "pending") return el("span", t.backingOff ? "backing off" : "queued", "muted");
  if (t.bridge) return soft(t.bridge + (t.instance ? " / " + t.instance : ""));
  const box = soft((t.state === "dispatching" ? "→ " : "") + (t.target || "-"));
  if (t.remoteTaskId) box.title = `${t.target} task ${t.remoteTaskId}`;
  return box;
}

// How long a task has been in its state; since when it was submitted, on hover.
function since(t) {
  const node = el("span", span(t.inStateS));
  node.title = `submitted ${span(t.ageS)} ago`;
  return node;
}

function renderLive(page) {
  const c = page.counts;
  $("#live-counts").textContent = `${c.running} running · ${c.dispatching} dispatching · ` +
    `${c.pending} waiting`;
  const last = page.offset + page.tasks.length;
  $("#live-range").textContent = page.total ? `${page.offset + 1}–${last} of ${page.total}` : "none";
  $("#live-prev").disabled = page.offset === 0;
  $("#live-next").disabled = last >= page.total;
  if (!page.tasks.length) {
    const none = el("td", page.total ? "" : "nothing waits or runs" + (filtered() ? " that matches" : ""), "muted");
    none.colSpan = 8;
    const row = el("tr", undefined, "none");
    row.append(none);
    $("#live tbody").replaceChildren(row);
    return;
  }
  fillTable("#live", page.tasks.map((t) => [
    taskLink(t.taskId), el("span", t.state, "state-" + t.state), soft(`${t.AIGC} / ${t.platform}`),
    where(t), t.attempt, since(t), t.backendId || "-",
    button("Cancel", async () => {
      await act("POST", `/api/tasks/${encodeURIComponent(t.taskId)}/cancel`);
      await loadLive();
    }),
  ]));
}

const NO_PRICE = "no price set";
const money = (n) => n.toFixed(2);

// A recorded cost, marked ≈ where (part of) it is the configured price rather than the
// platform's; "no price set" where nothing was recorded (`r` has no amount) and `priced` is
// false: no platform's figure and no price to estimate with, so 0.00 would mean nothing.
function cost(r, priced = true) {
  if (!r || !r.amount) return priced ? money(0) : NO_PRICE;
  if (!r.estimated) return money(r.amount);
  if (money(r.estimated) === money(r.amount)) return "≈" + money(r.amount);  // all of it
  return `${money(r.amount)} (≈${money(r.estimated)})`;
}

// A target's figure means something where its platform reported money or
// AIGCQ_OVERFLOW_PRICE prices it; elsewhere it says so.
const known = (r) => r.price != null || r.reported > 0;

function renderOverflow(o, trends, time) {
  if (!o) return;
  const priced = Object.keys(o.prices || {}).length > 0;
  fillTable("#overflow", o.targets.length
    ? o.targets.map((r) => [r.target, r.tasks,
      r.price != null ? money(r.price) : known(r) ? "-" : NO_PRICE,
      known(r) ? cost({ amount: r.cost, estimated: r.estimated }) : "-"])
    : [["-", 0, priced ? "-" : NO_PRICE, "-"]]);
  const counted = priced || o.targets.some(known);
  const unpriced = o.targets.some((r) => !known(r) && r.tasks);
  $("#overflow-total").textContent = `total ${o.totalTasks} tasks · ` +
    (counted ? `cost ${cost({ amount: o.totalCost, estimated: o.targets.reduce((n, r) => n + r.estimated, 0) })}` +
      (unpriced ? " (targets with no price set not counted)" : "")
      : `${NO_PRICE}: AIGCQ_OVERFLOW_PRICE (e.g. {"runninghub": 0.1}) prices each task sent`) +
    " · per process: sum /metrics across processes";
  const chart = $("#spend-chart");
  chart.toggleAttribute("hidden", !counted);  // an <svg> has no .hidden property
  $("#spend-legend").hidden = !counted;
  if (!counted) return;
  const h = trends.history;
  const from = Math.min(h.length ? h[0].t : time, time - 60);
  drawChart(chart, { unit: "cost", format: money, from, to: time,
    series: [{ name: "spend", cls: "spend", points: h.map((p) => [p.t, p.spend]) }] });
}

// Today's and this month's spend, fleet-wide (Redis): per project, account and workflow.
function renderSpend(sp, prices) {
  if (!sp) return;
  const { day, month } = sp;
  const priced = (target) => prices[target] != null;
  // a project is priced where one of the targets it ran on (its workflows') is
  const projectPriced = (aigc) => {
    const targets = [...day.workflows, ...month.workflows].filter((w) => w.AIGC === aigc).map((w) => w.target);
    return targets.length ? targets.some(priced) : Object.keys(prices).length > 0;
  };
  const anyPriced = Object.keys(prices).length > 0;
  // a row of the period, or "-": none that period
  const figure = (r, isPriced) => (r ? cost(r, isPriced) : "-");
  const find = (rows, r, keys) => rows.find((m) => keys.every((k) => m[k] === r[k]));
  const names = (rows, keys) => [...new Map(rows.map((r) => [keys.map((k) => r[k]).join("/"), r])).values()];
  const projects = names([...day.projects, ...month.projects], ["AIGC"]);
  fillTable("#spend-projects", projects.length ? projects.map((p) => {
    const today = find(day.projects, p, ["AIGC"]), isPriced = projectPriced(p.AIGC);
    return [p.AIGC, figure(today, isPriced), figure(find(month.projects, p, ["AIGC"]), isPriced),
      today ? today.tasks : 0];
  }) : [["-", "-", "-", 0]]);
  const accounts = names([...day.accounts, ...month.accounts], ["target", "account"]);
  fillTable("#spend-accounts", accounts.map((a) => {
    const today = find(day.accounts, a, ["target", "account"]);
    return [soft(`${a.target} ${a.account}`), figure(today, priced(a.target)),
      figure(find(month.accounts, a, ["target", "account"]), priced(a.target)), today ? today.coins : 0];
  }));
  fillTable("#spend-workflows", day.workflows.map((w) => [
    soft(`${w.target} ${w.workflow || "-"}`), w.AIGC, cost(w, priced(w.target)), w.tasks,
  ]));
  $("#spend-total").textContent = `today (${day.period}) ${cost(day.total, anyPriced)} · ` +
    `${day.total.tasks} tasks · this month (${month.period}) ${cost(month.total, anyPriced)}`;
}

// The paid accounts as the platform counts their tasks and as we do; the budgets and holds.
function renderAccounts(accounts, budgets, pauses) {
  const num = (v) => (v === null || v === undefined ? "-" : String(v));
  fillTable("#paid-accounts", (accounts || []).map((a) => [
    soft(`${a.target} ${a.account}`), a.projects.join(", "), num(a.theirs), num(a.ours),
    a.drift ? (a.drift > 0 ? `+${a.drift}` : String(a.drift)) : num(a.drift), num(a.remainCoins),
    a.polledAt ? clock(a.polledAt) + (a.error ? ` · ${a.error} (${a.failures}×)` : "") : a.error || "-",
    (a.suspects || []).map((x) => x.taskId).join(", ") || "-",
  ]));
  const spent = (f) => (f.limit === null ? String(f.spent) :
    `${f.spent} / ${f.limit}${f.reached ? " reached" : ""}`);
  const b = budgets || { projects: [], accounts: [] };
  if (b.timezone) $("#spend-zone").textContent = b.timezone;
  fillTable("#budgets", [
    ...b.projects.map((p) => [`project ${p.AIGC} (${p.onLimit})`, spent(p.day), spent(p.month), "-"]),
    ...b.accounts.map((a) => [soft(`account ${a.target} ${a.account}`), spent(a.day), spent(a.month),
      a.balanceFloor === null ? "-" :
        `${num(a.remainCoins)} / ${a.balanceFloor}${a.floorReached ? " reached" : ""}`]),
  ]);
  const holds = (pauses || []).filter((p) => p.kind === "hold");
  const alerts = $("#budget-alerts");
  alerts.textContent = holds.map((h) => `held ${h.name}: ${h.note}`).join(" · ");
  alerts.className = holds.length ? "legend error" : "legend";
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
  renderShares(s.shares);
  renderPools(s.capacity);
  renderTrends(s);
  renderSplit(s.split, s.time);
  renderHealth(s.health);
  renderRecent(s.recent);
  refreshLiveFilters(s.queues);
  loadLive();
  if (shownTask) showTask(shownTask, true);  // a shown task follows its state
  renderOverflow(s.overflow, s.trends, s.time);
  renderSpend(s.spend, (s.overflow && s.overflow.prices) || {});
  renderAsynch(s.asynch);
  renderAccounts(s.accounts, s.budgets, s.pauses);
  renderPauses(s.pauses);
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

// ---- the incident controls: pauses, and cancel / replay by filter ----------------------
async function control(path, body) {
  try {
    return await api("POST", path, body);
  } catch (e) {
    setStatus(e.message, true);
    return null;
  }
}

function renderPauses(pauses) {
  const rows = (pauses || []).map((p) => [
    `${p.kind} ${p.name}`, clock(p.since), soft(p.note || ""),
    button("Resume", () => control("/api/admin/resume", { kind: p.kind, name: p.name })),
  ]);
  fillTable("#pauses", rows.length ? rows : [["nothing is paused", "", "", ""]]);
}

// The filter of the form: project, platform, client, last change within N minutes.
function bulkFilter(dryRun) {
  const body = { dryRun };
  for (const f of ["project", "platform", "client"]) {
    const v = $("#bulk-" + f).value.trim();
    if (v) body[f] = v;
  }
  const minutes = parseFloat($("#bulk-since").value);
  if (minutes > 0) body.since = Date.now() / 1000 - minutes * 60;
  return body;
}

async function bulk(dryRun) {
  const action = $("#bulk-action").value;
  const a = await control("/api/admin/tasks/" + action, bulkFilter(dryRun));
  if (!a) return;
  const done = action === "cancel" ? [["cancelled", a.cancelled]]
    : [["queued again", a.queued], ["given their paid result", a.delivered]];
  const parts = [dryRun ? `${a.matched} match: ${a.tasks.join(" ") || "none"}`
    : done.map(([said, list]) => `${said} ${list.length}`).join(", ")];
  for (const s of a.skipped) parts.push(`${s.taskId} not done: ${s.reason}`);
  if (a.more) parts.push(`${a.matched - a.tasks.length} more match: apply again`);
  $("#bulk-result").textContent = parts.join("; ");
}

let shownTask = "", shownJson = "";

// Show task `id`; `quiet`: a refresh of the task shown (drawn again only if it changed).
async function showTask(id, quiet) {
  const box = $("#task");
  shownTask = id;
  if (!quiet) $("#task-id").value = id;
  let t;
  try {
    t = await api("GET", "/api/tasks/" + encodeURIComponent(id));
  } catch (e) {
    if (!quiet) box.replaceChildren(el("p", e.message, "error"));
    return;
  }
  const json = JSON.stringify(t);
  if (id !== shownTask || (quiet && json === shownJson)) return;
  shownJson = json;
  const table = el("table");
  table.id = "timeline";
  table.append(...[["time", "state", "target", "attempt", "note"], ...t.timeline.map((e) =>
    [clockMs(e.t), e.state, e.target || "-", e.attempt, soft(e.note || "")])].map((cells, i) => {
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

const TOKEN_HINT = "admin token required: open the dashboard link that `aigcq up` (or " +
  "`aigcq up --demo`) prints, or paste the token: AIGCQ_ADMIN_TOKEN, else admin_token in " +
  "the secrets file that banner names (.aigcq/secrets.json by default)";

async function stream() {
  for (;;) {
    try {
      const r = await fetch("/api/admin/events", { headers: headers() });
      $("#token-form").hidden = r.status !== 401;
      if (r.status === 401) {
        setStatus(TOKEN_HINT, true);
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
$("#live-filters").addEventListener("change", () => { liveOffset = 0; loadLive(); });
$("#live-prev").addEventListener("click", () => { liveOffset = Math.max(0, liveOffset - LIVE_PAGE); loadLive(); });
$("#live-next").addEventListener("click", () => { liveOffset += LIVE_PAGE; loadLive(); });
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token-input").value.trim());
  location.reload();
});
$("#pause-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const body = { kind: $("#pause-kind").value, name: $("#pause-name").value.trim(), note: $("#pause-note").value.trim() };
  if (await control("/api/admin/pause", body)) $("#pause-name").value = $("#pause-note").value = "";
});
$("#bulk-preview").addEventListener("click", () => bulk(true));
$("#bulk-form").addEventListener("submit", (ev) => { ev.preventDefault(); bulk(false); });
$("#search").addEventListener("submit", (ev) => { ev.preventDefault(); showTask($("#task-id").value.trim()); });
stream();
