// aigcq dashboard charts: time series as SVG, with a time axis, a value axis with its unit,
// round ticks and grid lines, drawn at the element's own size in CSS pixels (so labels are
// never stretched) and drawn again when that size changes. No library: the page works
// offline and has nothing to vendor.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const MARGIN = { left: 52, right: 12, top: 20, bottom: 24 };  // room for ticks and the unit
const TIME_STEPS = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];  // seconds
const TIME_HM = { hour12: false, hour: "2-digit", minute: "2-digit" };
const TIME_HMS = { ...TIME_HM, second: "2-digit" };

function svgNode(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// Ticks from 0 to at least `max`, about `count` of them, in steps of 1, 2 or 5 × 10^k
// (whole numbers only when `whole`: task counts).
function valueTicks(max, count, whole) {
  if (!(max > 0)) max = 1;  // nothing yet: 0 to 1
  const raw = max / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw * (1 - 1e-9));
  if (whole) step = Math.max(1, Math.round(step));
  const ticks = [];
  for (let i = 0; i * step <= max + step * (1 - 1e-9) && ticks.length < 12; i++) {
    ticks.push(Number((i * step).toPrecision(12)));
  }
  if (ticks.length < 2) ticks.push(step);
  return ticks;
}

// Round clock times between `from` and `to`, at most one per 80 px.
function timeTicks(from, to, width) {
  const room = Math.max(2, Math.floor(width / 80));
  const step = TIME_STEPS.find((s) => (to - from) / s <= room) || TIME_STEPS.at(-1);
  const ticks = [];
  for (let t = Math.ceil(from / step) * step; t <= to; t += step) ticks.push(t);
  return { ticks, label: (t) => new Date(t * 1000).toLocaleTimeString([], step < 60 ? TIME_HMS : TIME_HM) };
}

// The largest value drawn: of any point, or of a bucket's stacked sum.
function peak(spec) {
  if (spec.kind === "bars") {
    const sums = new Map();
    for (const s of spec.series) for (const [t, v] of s.points) sums.set(t, (sums.get(t) || 0) + v);
    return Math.max(0, ...sums.values());
  }
  return Math.max(0, ...spec.series.flatMap((s) => s.points.map((p) => p[1])));
}

/**
 * Draw `spec` into `svg`:
 *   unit      the value axis's unit, written above it ("tasks", "s", …)
 *   format    a tick's label from its value (default: the number)
 *   whole     ticks at whole numbers only
 *   kind      "line" (default) or "bars": each series' values stacked per bucket
 *   bucketS   a bar's width in seconds
 *   from, to  the time axis's span (epoch seconds)
 *   series    [{ name, cls, dashed, points: [[t, value], …] }]
 * The svg's data-y-ticks and data-x-ticks hold the labels drawn (for tests and readers).
 */
function drawChart(svg, spec) {
  svg._chart = spec;
  watchSize(svg);
  const width = Math.max(200, svg.clientWidth), height = Math.max(80, svg.clientHeight);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const plotW = width - MARGIN.left - MARGIN.right, plotH = height - MARGIN.top - MARGIN.bottom;
  const yt = valueTicks(peak(spec), 4, spec.whole);
  const top = yt.at(-1), format = spec.format || String;
  const span = Math.max(1, spec.to - spec.from);
  const x = (t) => MARGIN.left + ((t - spec.from) / span) * plotW;
  const y = (v) => MARGIN.top + plotH - (v / top) * plotH;
  const nodes = [svgNode("text", { x: 4, y: 12, class: "unit" }, spec.unit)];
  for (const v of yt) {
    nodes.push(svgNode("line", { x1: MARGIN.left, x2: MARGIN.left + plotW, y1: y(v), y2: y(v), class: "grid" }));
    nodes.push(svgNode("text", { x: MARGIN.left - 6, y: y(v) + 4, class: "tick y" }, format(v)));
  }
  const xt = timeTicks(spec.from, spec.to, plotW);
  const half = (t) => xt.label(t).length * 3.2;  // about half a label's width at 11 px
  xt.ticks = xt.ticks.filter((t) => x(t) - half(t) >= 0 && x(t) + half(t) <= width);  // none cut
  for (const t of xt.ticks) {
    nodes.push(svgNode("line", { x1: x(t), x2: x(t), y1: MARGIN.top + plotH, y2: MARGIN.top + plotH + 4, class: "axis" }));
    nodes.push(svgNode("text", { x: x(t), y: height - 6, class: "tick x" }, xt.label(t)));
  }
  nodes.push(svgNode("path", {
    d: `M${MARGIN.left},${MARGIN.top}V${MARGIN.top + plotH}H${MARGIN.left + plotW}`, class: "axis",
  }));
  nodes.push(...(spec.kind === "bars" ? bars(spec, x, y) : lines(spec, x, y)));
  if (!spec.series.some((s) => s.points.length)) {
    nodes.push(svgNode("text", { x: MARGIN.left + plotW / 2, y: MARGIN.top + plotH / 2, class: "empty" }, "no data yet"));
  }
  svg.replaceChildren(...nodes);
  svg.dataset.yTicks = yt.map(format).join("|");
  svg.dataset.xTicks = xt.ticks.map(xt.label).join("|");
}

function lines(spec, x, y) {
  return spec.series.filter((s) => s.points.length).map((s) => svgNode("polyline", {
    points: s.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" "),
    class: "series " + s.cls,
    ...(s.dashed ? { "stroke-dasharray": "6 4" } : {}),
  }));
}

function bars(spec, x, y) {
  const width = Math.max(1, x(spec.from + spec.bucketS) - x(spec.from) - 1);
  const base = new Map();
  const out = [];
  for (const s of spec.series) {
    for (const [t, v] of s.points) {
      if (!v) continue;
      const below = base.get(t) || 0;
      base.set(t, below + v);
      out.push(svgNode("rect", {
        x: x(t).toFixed(1), width: width.toFixed(1),
        y: y(below + v).toFixed(1), height: (y(below) - y(below + v)).toFixed(1),
        class: "bar " + s.cls,
      }));
    }
  }
  return out;
}

// Draw each chart again when its width changes (a window resized, a panel reflowed).
const sizes = new ResizeObserver((entries) => {
  for (const e of entries) if (e.target._chart) drawChart(e.target, e.target._chart);
});
function watchSize(svg) {
  if (!svg._watched) { svg._watched = true; sizes.observe(svg); }
}
