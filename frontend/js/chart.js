// Time-series charts with uPlot (vendored in ../vendor/uplot, MIT).
import uPlot from "../vendor/uplot/uPlot.esm.js";
import { fmtDateTime, fmtTick } from "./util.js";

const AXIS_FONT = "12px system-ui, -apple-system, 'Segoe UI', sans-serif";
const AXIS = { font: AXIS_FONT, stroke: "#556070", grid: { stroke: "#eef1f5", width: 1 }, ticks: { stroke: "#dde2ea", width: 1 } };
const measure = document.createElement("canvas").getContext("2d");
measure.font = AXIS_FONT;
// A value axis as wide as its longest label (uPlot's fixed size clipped "637 GiB"):
// tick (10) + gap (5) + text + a little air.
const fitLabels = (u, values) => 20 + Math.max(30, ...(values || []).map((v) => measure.measureText(v).width));

/**
 * A responsive line chart.
 *  series: [{label, color, scale: "pct" | "mb" | "w", fill?}]
 *  bands(): [{from, to, color, label}] in epoch seconds, drawn behind the data (off-peak windows)
 *  xRange(): [min, max] epoch seconds, or null for the data's extent
 *  ceil: {mb: () => number}: the least top of a scale (so 0 MiB used does not fill the chart)
 *  axisWidth: the least width of the value axis, so that charts under each other line up
 */
export function lineChart(container, { series, bands = () => [], xRange = () => null, ceil = {}, height = 260, axisWidth = 0 }) {
  const scales = { x: { time: true, range: (u, min, max) => xRange() || [min, max] } };
  const axes = [{ ...AXIS, space: 96, values: timeTicks }];
  const used = [...new Set(series.map((s) => s.scale))];
  used.forEach((scale, i) => {
    if (scale === "pct") scales.pct = { range: [0, 100] };
    // Memory and power axes start at 0; `ceil` (e.g. the cluster's total memory) caps them.
    else scales[scale] = { range: (u, min, max) => [0, Math.max(scale === "mb" ? 1024 : 10, (max || 0) * 1.1, ceil[scale]?.() || 0)] };
    axes.push({
      ...AXIS,
      scale,
      side: i === 0 ? 3 : 1,
      grid: i === 0 ? AXIS.grid : { show: false },
      size: (u, values) => Math.max(axisWidth, fitLabels(u, values)),
      values: (u, vals) => vals.map((v) => formatAxis(scale, v)),
      // Secondary axes tick at the same fifths as the % axis, so one grid serves both; a
      // memory or power axis of its own at quarters of its top (uPlot's round numbers of
      // MiB fall on odd GiB).
      splits: scale === "pct" ? undefined
        : (u, ai, min, max) => (i === 0 ? [0, 0.25, 0.5, 0.75, 1] : [0, 0.2, 0.4, 0.6, 0.8, 1]).map((f) => min + f * (max - min)),
    });
  });
  const opts = {
    width: Math.max(240, container.clientWidth || 600),
    height,
    scales,
    axes,
    legend: { show: false },
    cursor: { drag: { x: false, y: false } },
    series: [
      { label: "Time", value: (u, v) => (v == null ? "—" : fmtDateTime(new Date(v * 1000))) },
      ...series.map((s) => ({
        label: s.label,
        scale: s.scale,
        stroke: s.color,
        width: 2,
        fill: s.fill ? `${s.color}22` : undefined,
        spanGaps: false,
        // Single samples would be invisible as a line: show dots while data is sparse.
        points: { show: (u) => u.data[0].length < 40, size: 5 },
        value: (u, v) => (v == null ? "—" : formatAxis(s.scale, v)),
      })),
    ],
    hooks: {
      drawClear: [
        (u) => {
          const ctx = u.ctx;
          const { left, top, width, height: hgt } = u.bbox;
          ctx.save();
          for (const band of bands()) {
            const x0 = Math.max(left, u.valToPos(band.from, "x", true));
            const x1 = Math.min(left + width, u.valToPos(band.to, "x", true));
            if (x1 <= x0) continue;
            ctx.fillStyle = band.color;
            ctx.fillRect(x0, top, x1 - x0, hgt);
          }
          // "now" marker
          const now = Date.now() / 1000;
          const xn = u.valToPos(now, "x", true);
          if (xn > left && xn < left + width) {
            ctx.strokeStyle = "#94a3b8";
            ctx.setLineDash([4, 4]);
            ctx.beginPath();
            ctx.moveTo(xn, top);
            ctx.lineTo(xn, top + hgt);
            ctx.stroke();
          }
          ctx.restore();
        },
      ],
    },
  };
  const empty = [[], ...series.map(() => [])];
  const plot = new uPlot(opts, empty, container);
  container.after(legend(series));
  const resize = new ResizeObserver(() => {
    const w = container.clientWidth;
    if (w > 0 && Math.abs(w - plot.width) > 2) plot.setSize({ width: w, height });
  });
  resize.observe(container);
  return {
    setData(data) { plot.setData(data); },
    redraw() { plot.setData(plot.data); }, // recomputes the scales (e.g. after a new ceil)
    destroy() { resize.disconnect(); plot.destroy(); },
    setHidden(hidden) { container.hidden = hidden; container.nextElementSibling.hidden = hidden; },
  };
}

// One-line tick labels: "Sun 22" on midnight ticks, "14:00" elsewhere; seconds for short runs.
function timeTicks(u, vals, axisIdx, space, incr) {
  return vals.map((v) => {
    const d = new Date(v * 1000);
    if (incr < 60) return fmtTick(d, { seconds: true });
    if (incr >= 3600 && d.getHours() === 0 && d.getMinutes() === 0) return fmtTick(d, { day: true });
    return fmtTick(d);
  });
}

function legend(series) {
  const box = document.createElement("div");
  box.className = "chart-legend";
  for (const s of series) {
    const item = document.createElement("span");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = s.color;
    item.append(swatch, s.label);
    box.append(item);
  }
  return box;
}

function formatAxis(scale, v) {
  if (v == null) return "";
  if (scale === "pct") return `${Math.round(v)}%`;
  if (scale === "mb") return v >= 1000 ? `${(v / 1024).toFixed(v >= 10240 ? 0 : 1)} GiB` : `${Math.round(v)} MiB`;
  if (scale === "w") return v >= 1000 ? `${(v / 1000).toFixed(1)} kW` : `${Math.round(v)} W`;
  return String(v);
}

/** {points:[{at, ...}]} -> uPlot columns for the given keys. */
export function columns(points, keys) {
  const xs = points.map((p) => new Date(p.at).getTime() / 1000);
  return [xs, ...keys.map((k) => points.map((p) => (p[k] === undefined ? null : p[k])))];
}
