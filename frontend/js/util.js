// Small DOM and formatting helpers. Everything user-supplied goes through textContent.

/** h("div", {class: "x", onclick: fn}, child, "text", [more]) */
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      node.className = value;
    } else if (key === "style" && typeof value === "object") {
      Object.assign(node.style, value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (value === true) {
      node.setAttribute(key, "");
    } else {
      node.setAttribute(key, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}

export function clear(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// One time style, the CLI's: "2026-11-27 14:05:09 GMT+1": the browser's zone, 24-hour,
// to the second, the zone named (its abbreviation or offset, as the browser's locale has
// it). Every time the dashboard prints goes through stampParts; the pieces are put in
// one order here, whatever order the locale writes them in.
const stampFmt = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "2-digit", day: "2-digit",
  hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
  weekday: "short", timeZoneName: "short", numberingSystem: "latn",
});

function stampParts(at) {
  const d = at instanceof Date ? at : new Date(at);
  if (Number.isNaN(d.getTime())) return null;
  const p = {};
  for (const { type, value } of stampFmt.formatToParts(d)) p[type] = value;
  return p;
}

export const parseTime = (iso) => (iso ? new Date(iso) : null);
/** "2026-11-27 14:05:09 GMT+1" for an ISO time or a Date; "—" when absent. */
export function fmtDateTime(at) {
  const p = at ? stampParts(at) : null;
  return p ? `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}` : "—";
}
/** "14:05:09 GMT+1": a time of today (when a page was updated). */
export function fmtClock(at) {
  const p = at ? stampParts(at) : null;
  return p ? `${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}` : "—";
}
/** Compact axis labels, 24-hour: "14:05", "14:05:09" (seconds), "Sun 27" (day), "Sun 14:05". */
export function fmtTick(at, { seconds = false, day = false, dayHour = false } = {}) {
  const p = stampParts(at);
  if (!p) return "";
  if (day) return `${p.weekday} ${Number(p.day)}`;
  if (dayHour) return `${p.weekday} ${p.hour}:${p.minute}`;
  return seconds ? `${p.hour}:${p.minute}:${p.second}` : `${p.hour}:${p.minute}`;
}
/** "Sun" */
export const fmtWeekday = (at) => stampParts(at)?.weekday ?? "";

/** A pending job's reason in words, with the time it waits for (pending_until, which the
 * API gives as data, not in the message) in the dashboard's style. */
export function pendingText(job) {
  const text = job.pending_message || job.pending_reason || "";
  return job.pending_until ? `${text}; waits until ${fmtDateTime(job.pending_until)}` : text;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  if (d) return `${d}d ${hh}h`;
  if (hh) return `${hh}h ${String(mm).padStart(2, "0")}m`;
  if (mm) return `${mm}m ${String(ss).padStart(2, "0")}s`;
  return `${ss}s`;
}

export function fmtAgo(iso) {
  if (!iso) return "—";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  if (s < 0) return `in ${fmtDuration(-s)}`;
  if (s < 5) return "just now";
  return `${fmtDuration(s)} ago`;
}

export function fmtIn(iso) {
  if (!iso) return "—";
  const s = (new Date(iso).getTime() - Date.now()) / 1000;
  // "in 26337d" reads worse than days; callers show the time itself beside it.
  if (s > 7 * 86400) return `in ${Math.round(s / 86400)} days`;
  return s <= 0 ? "now" : `in ${fmtDuration(s)}`;
}

export function fmtNum(n, digits = 0) {
  if (n === null || n === undefined) return "—";
  return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

// Memory comes in MiB (as NVML reports it), so the larger unit is GiB.
export function fmtMem(mb) {
  if (mb === null || mb === undefined) return "—";
  return mb >= 1024 ? `${(mb / 1024).toFixed(1)} GiB` : `${mb} MiB`;
}

export const ACTIVE = new Set(["PENDING", "SCHEDULED", "RUNNING"]);
// States the API accepts a cancel for (service.cancel); finished jobs return 409.
export const CANCELLABLE = new Set(["PENDING", "SCHEDULED", "RUNNING", "PREEMPTED", "LOST"]);

export function statusBadge(status, extra = "") {
  return h("span", { class: `badge ${status} ${extra}`.trim() }, status.replace("_", " "));
}

export function reasonLabel(reason) {
  if (!reason) return "";
  return reason.toLowerCase().replace(/_/g, " ");
}

/** A job's name; an array task's with its index (the tasks share one name), as Slurm's 12_3. */
export function jobName(job) {
  return job.array ? `${job.name}[${job.array.index}]` : job.name;
}

export function gpuRequest(job) {
  if (job.gpus === 0) return "CPU only";
  let text = job.gpu_share && job.gpu_share < 1 ? `${job.gpu_share} GPU` : `${job.gpus} GPU`;
  if (job.nodes > 1) text += ` × ${job.nodes} nodes`;
  if (job.gpu_model) text += ` · ${job.gpu_model}`;
  return text;
}

export function allocationText(job) {
  if (!job.allocations || !job.allocations.length) return "—";
  return job.allocations
    .map((a) => `${a.node}:${a.gpu_index ?? "-"}${a.share < 1 ? ` (${a.share})` : ""}`)
    .join(", ");
}

let toastTimer = null;
export function toast(message, kind = "info") {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.className = `toast ${kind}`;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.hidden = true; }, 4000);
}

/**
 * Polls `fn` every `ms` while the page is mounted; waits for each run to finish before
 * scheduling the next, and pauses while the tab is hidden. Returns a stop function.
 */
/** The number fields whose input differs from `current(name)`: name -> number, or null
 * for an emptied field (a PATCH body sends only what was changed). */
export function changedNumbers(fields, inputs, current) {
  const changes = {};
  for (const [name] of fields) {
    const raw = inputs[name].value.trim();
    const value = raw === "" ? null : Number(raw);
    if (value !== current(name)) changes[name] = value;
  }
  return changes;
}

export function poll(fn, ms) {
  let stopped = false;
  let timer = null;
  const run = async () => {
    if (stopped) return;
    if (!document.hidden) {
      try {
        await fn();
        connection(true);
      } catch (err) {
        if (err && err.name !== "AbortError" && err.status !== 401) console.warn("refresh failed:", err.message);
        // Server down or restarting: say so once, in a banner, until a refresh succeeds.
        if (err && (err.status === 0 || err.status >= 500)) connection(false, err.message);
      }
    }
    if (!stopped) timer = setTimeout(run, ms);
  };
  run();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** On phones, show each row as a card: copy column names into data-label (see app.css). */
export function cardify(table) {
  table.classList.add("cards");
  const names = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
  for (const row of table.querySelectorAll("tbody tr")) {
    [...row.children].forEach((td, i) => { if (names[i]) td.dataset.label = names[i]; });
  }
  return table;
}

function connection(ok, message = "") {
  const banner = document.getElementById("conn");
  if (!banner) return;
  banner.hidden = ok;
  if (!ok) banner.textContent = `Live updates paused: ${message}. Retrying…`;
}
