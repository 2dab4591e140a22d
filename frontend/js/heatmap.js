// Per-GPU utilisation over time (GET /api/v1/utilization/gpus): one row per GPU, one cell
// per time bucket, darker is busier, as Ray's and Determined's GPU heatmaps. Cells are
// drawn on a canvas (64 GPUs x 168 hours would be 10,000 elements); the labels, each
// row's mean and the hover note are text.
import { clear, fmtDateTime, fmtTick, h } from "./util.js";

const ROW = 16; // px per GPU
const GAP = 2;
const NO_SAMPLE = "#eef1f5";
// Light to dark blue (the utilisation colour of the charts), readable at both ends.
const LOW = [232, 239, 255];
const HIGH = [30, 58, 138];

/** The colour of a utilisation in percent (null: no sample). */
export function cellColour(pct) {
  if (pct === null || pct === undefined) return NO_SAMPLE;
  const f = Math.max(0, Math.min(1, pct / 100));
  const rgb = LOW.map((lo, i) => Math.round(lo + (HIGH[i] - lo) * f));
  return `rgb(${rgb.join(",")})`;
}

const mean = (values) => {
  const present = values.filter((v) => v !== null && v !== undefined);
  return present.length ? present.reduce((a, b) => a + b, 0) / present.length : null;
};

export function heatmap(container) {
  const labels = h("div", { class: "hm-labels" });
  const canvas = h("canvas", { class: "hm-canvas", role: "img" });
  const means = h("div", { class: "hm-means" });
  const axis = h("div", { class: "hm-axis" });
  const tip = h("div", { class: "hm-tip", id: "heatmap-tip", role: "status", hidden: true });
  const plot = h("div", { class: "hm-plot" }, canvas, tip);
  const legend = h("div", { class: "chart-legend hm-legend" },
    h("span", {}, "0%", h("span", { class: "hm-scale", "aria-hidden": "true" }), "100% mean utilisation per GPU"),
    h("span", {}, h("span", { class: "swatch hm-none" }), "no sample (node down or not there yet)"));
  // Two grid rows: GPU labels | cells | means, then the time axis under the cells alone.
  clear(container, h("div", { class: "hm" }, labels, plot, means, h("span"), axis, h("span")), legend);
  const empty = h("div", { class: "empty", id: "heatmap-empty", hidden: true }, "No GPUs reported yet.");
  container.append(empty);
  let data = null;

  const draw = () => {
    if (!data) return;
    const gpus = data.gpus;
    empty.hidden = gpus.length > 0;
    const width = Math.max(120, plot.clientWidth);
    const height = Math.max(1, gpus.length * (ROW + GAP) - GAP);
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const buckets = gpus.length ? gpus[0].util_pct.length : 0;
    const cell = buckets ? width / buckets : width;
    gpus.forEach((gpu, row) => {
      gpu.util_pct.forEach((pct, col) => {
        ctx.fillStyle = cellColour(pct);
        // Cells overlap by a fraction of a pixel: no hairline seams between them.
        ctx.fillRect(col * cell, row * (ROW + GAP), cell + 0.5, ROW);
      });
    });
    clear(labels, gpus.map((gpu, row) => h("div", { class: "hm-label", title: gpu.model },
      row === 0 || gpus[row - 1].node !== gpu.node ? h("b", {}, gpu.node) : null, ` ${gpu.index}`)));
    clear(means, gpus.map((gpu) => {
      const m = mean(gpu.util_pct);
      return h("div", { class: "hm-mean", title: "mean over the range shown" }, m === null ? "—" : `${Math.round(m)}%`);
    }));
    const summary = gpus.map((gpu) => {
      const m = mean(gpu.util_pct);
      return `${gpu.node} GPU ${gpu.index}: ${m === null ? "no samples" : `${Math.round(m)}% on average`}`;
    });
    canvas.setAttribute("aria-label", `Utilisation per GPU over time. ${summary.join("; ")}`);
    renderAxis(width, buckets);
  };

  const bucketTime = (col) => new Date(Date.parse(data.since) + col * data.step * 1000);

  const renderAxis = (width, buckets) => {
    const ticks = Math.max(2, Math.min(6, Math.floor(width / 110)));
    const spans = [];
    for (let i = 0; i <= ticks; i += 1) {
      const col = Math.round((buckets * i) / ticks);
      const at = i === ticks ? new Date(Date.parse(data.until)) : bucketTime(col);
      const span = h("span", {}, tickText(at, data.step * buckets));
      span.style.left = `${(100 * i) / ticks}%`;
      if (i === ticks) span.classList.add("hm-last");
      spans.push(span);
    }
    clear(axis, spans);
  };

  const cellAt = (ev) => {
    if (!data || !data.gpus.length) return null;
    const box = canvas.getBoundingClientRect();
    const row = Math.floor((ev.clientY - box.top) / (ROW + GAP));
    const buckets = data.gpus[0].util_pct.length;
    const col = Math.floor(((ev.clientX - box.left) / box.width) * buckets);
    if (row < 0 || row >= data.gpus.length || col < 0 || col >= buckets) return null;
    return { gpu: data.gpus[row], col, x: ev.clientX - box.left, y: row * (ROW + GAP) };
  };

  canvas.addEventListener("mousemove", (ev) => {
    const at = cellAt(ev);
    if (!at) { tip.hidden = true; canvas.style.cursor = ""; return; }
    const pct = at.gpu.util_pct[at.col];
    const jobs = at.gpu.job_ids[at.col];
    clear(tip, h("b", {}, `${at.gpu.node} GPU ${at.gpu.index}`), ` · ${fmtDateTime(bucketTime(at.col).toISOString())}`,
      h("br"), pct === null ? "no sample" : `${Math.round(pct)}% utilised`,
      jobs.length ? ` · job${jobs.length > 1 ? "s" : ""} ${jobs.map((j) => `#${j}`).join(", ")}` : "");
    tip.hidden = false;
    const left = Math.min(at.x + 12, plot.clientWidth - tip.offsetWidth - 4);
    tip.style.left = `${Math.max(0, left)}px`;
    tip.style.top = `${at.y + ROW + 4}px`;
    canvas.style.cursor = jobs.length === 1 ? "pointer" : "";
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  // A cell of one job opens that job's page.
  canvas.addEventListener("click", (ev) => {
    const at = cellAt(ev);
    const jobs = at ? at.gpu.job_ids[at.col] : [];
    if (jobs.length === 1) window.location.hash = `#/jobs/${jobs[0]}`;
  });

  const resize = new ResizeObserver(() => draw());
  resize.observe(plot);
  return {
    setData(next) { data = next; draw(); },
    destroy() { resize.disconnect(); },
  };
}


function tickText(date, spanS) {
  return spanS > 86400 ? fmtTick(date, { dayHour: true }) : fmtTick(date);
}
