// Overview: GPUs now, utilisation over the last hour, day or week with off-peak bands,
// running jobs, each GPU's utilisation over the same time (a heatmap), jobs per project.
import { api, hideFieldErrors, optional, showFieldErrors } from "../api.js";
import { columns, lineChart } from "../chart.js";
import { heatmap } from "../heatmap.js";
import {
  allocationText, cardify, changedNumbers, clear, fmtDateTime, fmtDuration, fmtIn, fmtNum, fmtClock, h, jobName, poll, toast,
} from "../util.js";

// The time ranges the charts show (as Grafana's and Ray's pickers): seconds back from now,
// and the bucket width that keeps each at 60-170 points.
const RANGES = {
  "1h": { seconds: 3600, step: 60, title: "last hour" },
  "24h": { seconds: 86400, step: 600, title: "last 24 hours" },
  "7d": { seconds: 7 * 86400, step: 3600, title: "last 7 days" },
};
const RANGE_KEY = "gpusched.range";
const RUNNING_SHOWN = 20;
// As Slurm's sshare: a project's part of the weights against its part of the recent
// (decayed) GPU use; above its share, fair share ranks its jobs later.
const FAIR_SHARE_HINT =
  "The project's part of all fair-share weights / its part of all GPU time used lately " +
  "(older use counting less). A project above its share has its jobs ranked later.";
const BAND = "rgba(16, 185, 129, 0.13)";

/** One of busy / foreign / idle / down for a GPU (exclusive, in that precedence after down). */
export function gpuState(node, gpu) {
  if (!gpu.healthy || node.state !== "READY") return "down";
  // Unknown (a deciding reading failed) and MIG-sliced GPUs take no jobs: not idle.
  if ((gpu.unknown_readings || []).length || gpu.mig_enabled) return "down";
  if (gpu.allocated > 0) return "busy";
  if ((gpu.foreign_util_pct || 0) > 0 || (gpu.foreign_memory_mb || 0) > 0) return "foreign";
  return "idle";
}

/** Off-peak windows from /windows/upcoming, or null when the endpoint does not exist. */
export async function loadWindows(days = 7) {
  const list = await optional("/api/v1/windows/upcoming", { query: { days } }, null);
  if (list === null) return null;
  return (Array.isArray(list) ? list : list.items || [])
    .map((w) => ({ ...w, from: Date.parse(w.opens_at) / 1000, to: Date.parse(w.closes_at) / 1000 }))
    .sort((a, b) => a.from - b.from);
}

/** The range asked for in the page's address (#/?range=24h), else the last one chosen. */
function initialRange(params) {
  const asked = params?.get("range");
  if (asked && RANGES[asked]) return asked;
  const stored = localStorage.getItem(RANGE_KEY);
  return stored && RANGES[stored] ? stored : "1h";
}

export function overviewPage(root, ctx, { params } = {}) {
  let range = initialRange(params);
  const stats = h("div", { class: "stats", id: "gpu-stats" });
  const chartBox = h("div", { class: "chart", id: "util-chart" });
  const chartTitle = h("h2", {});
  const windowsLine = h("div", { class: "chart-legend", id: "window-note" });
  const projects = h("div", { id: "projects" });
  const editor = h("div", { id: "project-editor", hidden: true });
  const running = h("div", { id: "running-jobs" });
  const runningCount = h("span", { class: "small muted" });
  const heatTitle = h("h2", {});
  const heatBox = h("div", { id: "gpu-heatmap" });
  const heatCard = h("section", { class: "card", id: "heatmap-card" },
    h("div", { class: "card-head" }, heatTitle,
      h("span", { class: "small muted hide-sm" }, "hover a cell for its time and jobs; a job's cell opens it")),
    heatBox);
  const updated = h("span", { class: "sub" });
  const rangeButtons = Object.entries(RANGES).map(([key, r]) => h("button", {
    type: "button", class: "btn btn-sm", dataset: { range: key }, title: `Show the ${r.title}`,
    onclick: () => setRange(key),
  }, key.replace(/(\d)([hd])/, "$1 $2")));
  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Cluster overview"),
      h("div", { class: "head-right" },
        h("div", { class: "segmented", role: "group", "aria-label": "Time range of the charts", id: "range" }, rangeButtons),
        updated)),
    stats,
    h("div", { class: "grid grid-2" },
      h("section", { class: "card" },
        h("div", { class: "card-head" }, chartTitle),
        chartBox,
        windowsLine),
      h("section", { class: "card" },
        h("div", { class: "card-head" }, h("h2", {}, "Jobs by project"),
          h("a", { href: "#/queue", class: "small" }, "Open queue →")),
        projects, editor)),
    h("section", { class: "card", id: "running-card" },
      h("div", { class: "card-head" }, h("h2", {}, "Running jobs"), runningCount),
      running),
    heatCard,
  );

  let windows = [];
  let memTotal = 0;
  const chart = lineChart(chartBox, {
    ceil: { mb: () => memTotal },
    series: [
      { label: "Utilisation", color: "#1d4ed8", scale: "pct", fill: true },
      { label: "Memory used", color: "#7c3aed", scale: "mb" },
    ],
    bands: () => (windows || []).map((w) => ({ from: w.from, to: w.to, color: BAND })),
    // The past only, up to now: the next window is in the note below the chart.
    xRange: () => {
      const now = Date.now() / 1000;
      return [now - RANGES[range].seconds, now];
    },
  });
  const heat = heatmap(heatBox);
  const refreshNodes = async () => {
    const nodes = await api("/api/v1/nodes");
    const count = { busy: 0, idle: 0, foreign: 0, down: 0 };
    let util = 0;
    let sampled = 0;
    let memUsed = 0;
    let total_mb = 0;
    for (const node of nodes) {
      for (const gpu of node.gpus) {
        count[gpuState(node, gpu)] += 1;
        if (gpu.util_pct !== null && gpu.util_pct !== undefined) {
          util += gpu.util_pct;
          sampled += 1;
        }
        memUsed += gpu.memory_used_mb || 0;
        total_mb += gpu.memory_total_mb || 0;
      }
    }
    if (total_mb !== memTotal) {
      memTotal = total_mb;
      chart.redraw();
    }
    const total = count.busy + count.idle + count.foreign + count.down;
    const stat = (cls, label, value, hint) =>
      h("div", { class: `stat ${cls}`, dataset: { stat: cls } },
        h("div", { class: "label" }, label), h("div", { class: "value" }, value), h("div", { class: "hint" }, hint));
    clear(stats,
      stat("util", "Utilisation now", sampled ? `${fmtNum(util / sampled)}%` : "—",
        `${fmtNum(memUsed / 1024, 0)} / ${fmtNum(total_mb / 1024, 0)} GiB memory in use`),
      stat("busy", "Busy", count.busy, `of ${total} GPUs allocated to jobs`),
      stat("idle", "Idle", count.idle, "free for new jobs"),
      stat("foreign", "Foreign-used", count.foreign, "used outside the scheduler"),
      stat("down", "Down", count.down, "unhealthy or node not ready"));
    updated.textContent = `Updated ${fmtClock(new Date())}`;
  };

  const pct = (fraction) => `${Math.round(fraction * 100)}%`;
  // Admins change a project's guarantee, weight and longest time limit (PATCH, as
  // sacctmgr modify account); is_admin null = unknown (no /me): a 403 explains itself.
  const canAdmin = ctx.me?.is_admin !== false;
  const openEditor = (q) => {
    const fields = [
      ["gpu_quota", "Guaranteed GPUs", "0: none (it only borrows idle GPUs)"],
      ["weight", "Fair-share weight", "its share relative to the other projects' weights"],
      ["max_runtime_s", "Longest time limit (s)", "empty: the cluster's"],
    ];
    const inputs = Object.fromEntries(fields.map(([name]) => [name, h("input", {
      type: "number", inputmode: "decimal", id: `p-${name}`, value: q[name] ?? "", step: name === "weight" ? "any" : "1",
    })]));
    const errors = Object.fromEntries(fields.map(([name]) => [name,
      h("div", { class: "field-error", id: `perr-${name}`, role: "alert", hidden: true })]));
    const general = h("div", { class: "error-box", role: "alert", hidden: true });
    const close = () => { editor.hidden = true; clear(editor); };
    const save = async (ev) => {
      ev.preventDefault();
      hideFieldErrors(errors, general);
      const changes = changedNumbers(fields, inputs, (name) => q[name] ?? null);
      if (!Object.keys(changes).length) { close(); return; }
      try {
        await api(`/api/v1/projects/${encodeURIComponent(q.project)}`, { method: "PATCH", body: changes });
        toast(`Project ${q.project} changed`);
        close();
        refreshQueues();
      } catch (err) {
        showFieldErrors(err, errors, general);
      }
    };
    clear(editor, h("h3", {}, `Change project ${q.project}`),
      h("form", { onsubmit: save, novalidate: true },
        h("div", { class: "form-grid" }, fields.map(([name, label, help]) => h("div", { class: "field span-2" },
          h("label", { for: `p-${name}` }, label), inputs[name], h("div", { class: "help" }, help), errors[name]))),
        general,
        h("p", { class: "small muted" }, "Jobs already submitted keep their time limit."),
        h("div", { class: "form-actions" },
          h("button", { type: "submit", class: "btn btn-primary btn-sm", id: "save-project" }, "Save"),
          h("button", { type: "button", class: "btn btn-ghost btn-sm", onclick: close }, "Close"))));
    editor.hidden = false;
    inputs.gpu_quota.focus();
  };
  const refreshQueues = async () => {
    const queues = await api("/api/v1/queues");
    if (!queues.length) {
      clear(projects, h("div", { class: "empty" }, "No projects visible to you."));
      return;
    }
    clear(projects, h("div", { class: "table-wrap" }, h("table", { id: "projects-table" },
      h("thead", {}, h("tr", {},
        h("th", {}, "Project"), h("th", { class: "num" }, "Running"), h("th", { class: "num" }, "Pending"),
        h("th", { class: "num", title: "GPUs its jobs hold now" }, "GPUs"), h("th", { class: "num hide-sm" }, "Quota"),
        h("th", { class: "num hide-sm", title: FAIR_SHARE_HINT }, "Share / use"))),
      h("tbody", {}, queues.map((q) => h("tr", {},
        h("td", { class: "project-cell" }, h("a", { href: `#/queue?project=${encodeURIComponent(q.project)}` }, q.project),
          canAdmin ? h("button", {
            type: "button", class: "icon-btn", dataset: { editProject: q.project }, "aria-label": `Change project ${q.project}`,
            title: `Change its quota, weight or time limit (longest now: ${q.max_runtime_s ? fmtDuration(q.max_runtime_s) : "the cluster's"})`,
            onclick: () => openEditor(q),
          }, "✎") : null),
        h("td", { class: "num" }, fmtNum(q.running)),
        h("td", { class: "num", title: q.held ? `${fmtNum(q.held)} of them held: none starts until released` : null },
          fmtNum(q.pending), q.held ? h("span", { class: "muted small" }, ` (${fmtNum(q.held)} held)`) : null),
        h("td", { class: "num" }, fmtNum(q.gpus_in_use, q.gpus_in_use % 1 ? 1 : 0)),
        h("td", { class: "num hide-sm" }, q.gpu_quota ? fmtNum(q.gpu_quota) : "none"),
        h("td", {
          class: `num hide-sm${q.usage_share > q.fair_share ? " over-share" : ""}`,
          title: q.usage_share === null ? "no recent use" :
            `${fmtNum(q.usage_gpu_hours, 1)} GPU-hours used lately (decayed)`,
        }, `${pct(q.fair_share)} / ${q.usage_share === null ? "–" : pct(q.usage_share)}`)))))));
  };

  const refreshChart = async () => {
    const { seconds, step } = RANGES[range];
    // On a multiple of the step, so that buckets start on whole minutes and hours.
    const since = new Date(Math.floor((Date.now() / 1000 - seconds) / step) * step * 1000).toISOString();
    const [series, gpus, upcoming] = await Promise.all([
      api("/api/v1/utilization", { query: { since, step } }),
      optional("/api/v1/utilization/gpus", { query: { since, step } }, null),
      loadWindows(7),
    ]);
    windows = upcoming;
    chart.setData(columns(series.points || [], ["util_pct", "memory_used_mb"]));
    heatCard.hidden = gpus === null; // a server without the endpoint
    if (gpus !== null) heat.setData(gpus);
    renderWindowNote(windowsLine, upcoming);
  };

  const refreshRunning = async () => {
    const page = await api("/api/v1/jobs", { query: { status: ["RUNNING"], limit: RUNNING_SHOWN } });
    const jobs = page.items || [];
    runningCount.textContent = page.next_cursor ? `the ${RUNNING_SHOWN} submitted last` : "";
    if (!jobs.length) {
      clear(running, h("div", { class: "empty", id: "no-running" }, "No job is running."));
      return;
    }
    const now = Date.now();
    const table = h("table", { id: "running-table" },
      h("thead", {}, h("tr", {},
        h("th", {}, "Job"), h("th", {}, "User"), h("th", {}, "Project"), h("th", {}, "GPUs"),
        h("th", { class: "num" }, "Running for"), h("th", { class: "num hide-sm" }, "Time left"))),
      h("tbody", {}, jobs.map((job) => {
        const ran = (now - Date.parse(job.started_at)) / 1000;
        return h("tr", { dataset: { job: job.id } },
          h("td", { class: "wide" }, h("a", { href: `#/jobs/${job.id}` }, `#${job.id} ${jobName(job)}`)),
          h("td", {}, job.user),
          h("td", {}, job.project),
          h("td", { class: "mono" }, allocationText(job)),
          h("td", { class: "num" }, fmtDuration(ran)),
          h("td", { class: "num hide-sm", title: job.max_runtime_s ? `time limit ${fmtDuration(job.max_runtime_s)}` : null },
            job.max_runtime_s ? fmtDuration(job.max_runtime_s - ran) : "no limit"));
      })));
    clear(running, h("div", { class: "table-wrap" }, cardify(table)),
      page.next_cursor ? h("a", { href: "#/queue", class: "small" }, "All running jobs in the queue →") : null);
  };

  const renderRange = () => {
    chartTitle.textContent = `GPU utilisation, ${RANGES[range].title}`;
    heatTitle.textContent = `Utilisation per GPU, ${RANGES[range].title}`;
    for (const button of rangeButtons) {
      button.setAttribute("aria-pressed", String(button.dataset.range === range));
    }
  };
  const setRange = (key) => {
    range = key;
    localStorage.setItem(RANGE_KEY, key);
    // In the address, so that a link shows the same; without a new render.
    history.replaceState(null, "", `#/?range=${key}`);
    renderRange();
    chart.redraw();
    refreshChart().catch((err) => toast(err.message, "error"));
  };
  renderRange();

  const stops = [poll(refreshNodes, 5000), poll(refreshQueues, 5000), poll(refreshRunning, 5000),
    poll(refreshChart, 60000)];
  return () => {
    stops.forEach((stop) => stop());
    chart.destroy();
    heat.destroy();
  };
}

function renderWindowNote(box, windows) {
  if (windows === null || !windows.length) {
    clear(box, h("span", { id: "no-windows" }, "No off-peak windows configured."));
    return;
  }
  const now = Date.now() / 1000;
  const current = windows.find((w) => w.from <= now && w.to > now);
  const next = windows.find((w) => w.from > now);
  clear(box,
    h("span", {}, h("span", { class: "swatch", style: { background: "rgba(16,185,129,.35)" } }), "Off-peak window"),
    current ? h("span", {}, h("b", {}, current.window), ` open now, closes ${fmtIn(current.closes_at)}`) : null,
    next ? h("span", {}, "Next: ", h("b", {}, next.window), ` ${fmtDateTime(next.opens_at)} (${fmtIn(next.opens_at)})`) : null);
}
