// Job detail: spec, event timeline, live log tail, GPU telemetry over the run, energy.
import { api, ApiError, hideFieldErrors, optional, showFieldErrors } from "../api.js";
import { columns, lineChart } from "../chart.js";
import {
  ACTIVE, allocationText, changedNumbers, clear, fmtDateTime, fmtDuration, fmtIn, fmtNum, gpuRequest,
  h, jobName, pendingText, poll, reasonLabel, statusBadge, toast,
} from "../util.js";
import { cancelArrayButton, cancelButton, holdArrayButton, holdButton, requeueButton } from "./queue.js";
import { DEPENDENCY_KINDS } from "./submit.js";

// What the jobs a job depends on must do (its dependency kind, as sbatch --dependency).
const MUST = { afterok: "must succeed", afterany: "must end", afternotok: "must fail", after: "must start" };

function kvList(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function mapText(obj) {
  const entries = Object.entries(obj || {});
  return entries.length ? h("span", { class: "mono" }, entries.map(([k, v]) => `${k}=${v}`).join(", ")) : "—";
}

// The API gives an environment's values to the job's owner and admins only (an exported
// environment holds its submitter's keys): the others see the names.
function envText(env) {
  const hidden = Object.values(env).some((v) => v === null);
  return h("span", { class: "mono", title: hidden ? "values hidden: only the job's owner and admins read them" : undefined },
    Object.entries(env).map(([k, v]) => (v === null ? `${k}=…` : `${k}=${v}`)).join(", "));
}

// Waiting jobs the scheduler does not rank: their dependencies or their array's limit
// hold them back, or no opening of their off-peak window is long enough. A new one is
// asked for: its rank says when the next full cycle ranks it.
const NOT_RANKED = new Set(["dependency", "array_limit", "begin_time", "never_in_window"]);

// How one webhook message's delivery went (GET /jobs/{id}/notifications).
function deliveryText(n) {
  const tries = `${n.attempts} ${n.attempts === 1 ? "try" : "tries"}`;
  if (n.state === "delivered") return `delivered ${fmtDateTime(n.sent_at)}`;
  if (n.state === "given_up") return `given up after ${tries}: ${n.error}`;
  if (n.state === "retrying") return `failed (${n.error}), ${tries}; tried again ${fmtIn(n.next_at)}`;
  return "queued: sent within seconds";
}

function scheduleText(s) {
  if (!s || s.mode === "now") return "as soon as possible";
  if (s.mode === "offpeak") return `off-peak${s.window ? ` (${s.window})` : ""}`;
  return `at ${fmtDateTime(s.at)}`;
}

export function jobPage(root, ctx, { match }) {
  const jobId = Number(match[1]);
  const head = h("div", { class: "page-head" });
  const spec = h("section", { class: "card", id: "job-spec" });
  const editor = h("section", { class: "card", id: "job-change", hidden: true });
  const events = h("section", { class: "card", id: "job-events" });
  // Utilisation and memory in two charts under each other: on one plot their lines
  // (percent and MiB on two axes) lie on top of each other.
  const chartBox = h("div", { class: "chart", id: "job-chart" });
  const memoryBox = h("div", { class: "chart", id: "job-memory-chart" });
  const chartNote = h("div", { class: "chart-legend" });
  const logPre = h("pre", { class: "log", id: "job-log", tabindex: "0", "aria-label": "Job log" });
  const logNote = h("span", { class: "small muted" });
  // Each node of a multi-node job writes its own log.
  const logNode = h("select", { id: "log-node", class: "inline-input", "aria-label": "Which node's log", hidden: true,
    onchange: () => refreshLog() });
  root.append(head,
    h("div", { class: "grid grid-2" },
      h("div", { class: "stack" },
        h("section", { class: "card" },
          h("div", { class: "card-head" }, h("h2", {}, "Log"), h("span", {}, logNode, " ", logNote)),
          logPre),
        h("section", { class: "card" },
          h("div", { class: "card-head" }, h("h2", {}, "GPU utilisation and memory")),
          chartBox, memoryBox, chartNote)),
      h("div", { class: "stack" }, editor, spec, events)));

  let job = null;
  let notifications = [];
  let rank = null;
  let rankAt = 0;
  let rankFor = null; // the stored queue position it was asked for
  // The job's run: a finished one's exactly (at least 30 s), a running one's with 2 minutes
  // ahead at first, so a fresh job does not show millisecond ticks.
  const runRange = () => {
    if (!job || !job.started_at) return null;
    const from = Date.parse(job.started_at) / 1000;
    if (job.finished_at) return [from, Math.max(Date.parse(job.finished_at) / 1000, from + 30)];
    return [from, Math.max(Date.now() / 1000, from + 120)];
  };
  let memoryTotal = 0; // MiB of the GPUs it holds (or held): the memory chart's top
  const chart = lineChart(chartBox, {
    height: 170,
    axisWidth: 76, // as wide as the memory chart's "159 GiB": their times line up
    xRange: runRange,
    series: [{ label: "Utilisation (mean of its GPUs)", color: "#1d4ed8", scale: "pct", fill: true }],
  });
  const memoryChart = lineChart(memoryBox, {
    height: 150,
    axisWidth: 76,
    xRange: runRange,
    ceil: { mb: () => memoryTotal },
    series: [{ label: "Memory used, all its GPUs together (up to the memory they have)", color: "#7c3aed", scale: "mb", fill: true }],
  });

  let stopped = false;
  let efficiency = null; // GET /jobs/{id}/efficiency: energy, cost and advice
  let script = null; // GET /jobs/{id}/script once asked for: it does not change
  let scriptShown = false;

  const energyText = () => {
    if (!efficiency || !efficiency.gpu_hours) return "—";
    let text = `${fmtNum(efficiency.energy_wh, 1)} Wh`;
    if (efficiency.cost !== null && efficiency.cost !== undefined) {
      text += ` · cost ${fmtNum(efficiency.cost, 2)} (at peak price ${fmtNum(efficiency.cost_at_peak, 2)})`;
    }
    return text;
  };

  const placed = (j) => j.status === "SCHEDULED" || j.status === "RUNNING";
  let headShows = null; // what the head was last built from
  const renderHead = () => {
    if (head.querySelector(".armed")) return; // keep a half-confirmed cancel
    // Rebuilt only when the job or the editor changed, or a button waits to be enabled
    // again after its action: a rebuild by the refresh between a click's press and its
    // release replaced the button under the pointer, and the click was lost.
    const shows = JSON.stringify([job, editor.hidden]);
    if (shows === headShows && !head.querySelector("button:disabled")) return;
    headShows = shows;
    clear(head,
      h("div", {},
        h("div", { class: "small" }, h("a", { href: "#/queue" }, "← Queue")),
        h("h1", {}, `${jobName(job)} `, h("span", { class: "muted mono", style: { fontSize: ".8em" } }, `#${job.id}`))),
      h("div", { class: "form-actions" }, statusBadge(job.status),
        job.status === "PENDING" || placed(job) ? h("button", {
          type: "button", class: "btn btn-ghost btn-sm", id: "change-job", "aria-expanded": String(!editor.hidden),
          onclick: () => (editor.hidden ? openEditor() : closeEditor()),
        }, "Change") : null,
        holdButton(job, () => Promise.all([refreshJob(), refreshEvents()])),
        requeueButton(job, () => Promise.all([refreshJob(), refreshEvents()])),
        cancelButton(job, () => Promise.all([refreshJob(), refreshEvents()])),
        holdArrayButton(job, () => Promise.all([refreshJob(), refreshEvents()])),
        cancelArrayButton(job, () => Promise.all([refreshJob(), refreshEvents()]))));
    // The form was made for a pending job or for a placed one; another state closes it.
    if (editorMode !== (job.status === "PENDING" ? "pending" : placed(job) ? "placed" : null)) closeEditor();
    document.title = `#${job.id} ${jobName(job)} · gpusched`;
  };

  const toggleScript = async () => {
    scriptShown = !scriptShown;
    if (scriptShown && script === null) script = await api(`/api/v1/jobs/${jobId}/script`, { text: true });
    renderSpec();
  };

  const renderSpec = () => {
    const elapsed = job.started_at
      ? ((job.finished_at ? Date.parse(job.finished_at) : Date.now()) - Date.parse(job.started_at)) / 1000
      : null;
    clear(spec, h("h2", {}, "Job"),
      h("pre", { class: "cmd", id: "job-command" },
        Array.isArray(job.command) ? job.command.map((a) => (/\s/.test(a) ? JSON.stringify(a) : a)).join(" ") : job.command),
      job.script_bytes != null ? h("div", { id: "job-script", style: { marginTop: ".5rem" } },
        h("span", { class: "muted" }, `runs its script as submitted (${fmtNum(job.script_bytes)} bytes) `),
        h("button", { type: "button", class: "btn btn-ghost btn-sm", id: "job-script-toggle", onclick: toggleScript },
          scriptShown ? "Hide script" : "Show script"),
        scriptShown && script !== null ? h("pre", { class: "cmd", id: "job-script-text" }, script) : null) : null,
      h("div", { style: { height: ".8rem" } }),
      kvList([
        ["Status", h("span", {}, statusBadge(job.status), job.exit_code !== null ? ` exit ${job.exit_code}` : "")],
        job.status === "PENDING" && job.pending_reason ? ["Waiting", h("span", { id: "job-reason" },
          h("span", { class: "badge warn" }, reasonLabel(job.pending_reason)), " ", pendingText(job))] : null,
        job.queue_position ? ["Queue position", String(job.queue_position)] : null,
        rank && !rank.ranked ? ["Ahead of it", h("span", { id: "job-rank" }, rank.message)] : null,
        rank && rank.ranked ? ["Ahead of it", h("span", { id: "job-rank" }, rank.ahead.length
          ? rank.ahead.map((a) => `${a.jobs} by ${a.text}`).join("; ")
          : "nobody: first in line", h("span", { class: "muted", title: `ranked ${fmtDateTime(rank.ranked_at)}` },
          ` (${rank.position} of ${rank.waiting} at the last full cycle, policy ${rank.policy})`))] : null,
        job.estimated_start_at ? ["Estimated start", `${fmtDateTime(job.estimated_start_at)} (${fmtIn(job.estimated_start_at)})`] : null,
        ["Project", job.project],
        ["User", job.user],
        ["Request", gpuRequest(job)],
        job.gpu_memory_mb ? ["GPU memory", `${fmtNum(job.gpu_memory_mb)} MiB per GPU`] : null,
        job.only_nodes || job.exclude_nodes?.length ? ["Nodes", h("span", { id: "job-node-choice" },
          [job.only_nodes ? `only on ${job.only_nodes.join(", ")}` : "",
            job.exclude_nodes?.length ? `excludes ${job.exclude_nodes.join(", ")}` : ""].filter(Boolean).join("; "))] : null,
        placedOn(job),
        job.notify_url ? ["Notifies", h("span", { id: "job-notify" }, h("span", { class: "mono" }, job.notify_url),
          ` when it ${job.notify_on.map((e) => ({ start: "starts", end: "ends", fail: "fails", requeue: "is requeued" })[e] || e).join(" or ")}`)] : null,
        notifications.length ? ["Messages", h("ul", { class: "plain", id: "job-notifications" },
          notifications.map((n) => h("li", {}, h("b", {}, n.event), " · ", deliveryText(n))))] : null,
        ["Priority", String(job.priority)],
        ["Schedule", scheduleText(job.schedule)],
        job.array ? ["Array", h("span", { id: "job-array" }, `task ${job.array.index} of array `,
          h("a", { href: `#/jobs/${job.array.id}` }, `#${job.array.id}`),
          ` (${job.array.tasks} tasks${job.array.max_running ? `, at most ${job.array.max_running} at once` : ""})`)] : null,
        job.depends_on.length ? ["Depends on", h("span", { id: "job-depends-on" },
          ...job.depends_on.flatMap((id, i) => [i ? ", " : "", h("a", { href: `#/jobs/${id}` }, `#${id}`)]),
          ` (${MUST[job.dependency] || job.dependency})`)]
          : job.dependency === "singleton" ? ["Depends on", h("span", { id: "job-depends-on" },
            `singleton: one job named ${jobName(job)} of ${job.user}'s at a time`)] : null,
        ["Preemptible", job.preemptible ? "yes" : "no"],
        ["Retries", job.retries ? `${job.failures} of ${job.retries} used` : "none"],
        ["Attempt", String(job.attempt)],
        job.max_runtime_s ? ["Max runtime", fmtDuration(job.max_runtime_s)] : null,
        job.estimated_runtime_s ? ["Estimated runtime", fmtDuration(job.estimated_runtime_s)] : null,
        job.grace_s != null ? ["Grace", `${fmtDuration(job.grace_s)} from SIGTERM to SIGKILL, to checkpoint`] : null,
        ["Elapsed", elapsed === null ? "—" : fmtDuration(elapsed)],
        ["Energy", energyText()],
        efficiency && efficiency.avg_util_pct !== null && efficiency.avg_util_pct !== undefined
          ? ["GPU utilisation", `${fmtNum(efficiency.avg_util_pct, 0)}% average over ${fmtNum(efficiency.gpu_hours, 2)} GPU-hours`] : null,
        ...(efficiency ? efficiency.flags : []).map((f) => ["Advice", h("span", { class: "advice" },
          h("span", { class: "badge warn" }, f.code.replace(/_/g, " ")), ` ${f.message}. ${f.advice}`)]),
        job.workdir ? ["Workdir", h("span", { class: "mono" }, job.workdir)] : null,
        Object.keys(job.env || {}).length ? ["Env", envText(job.env)] : null,
        Object.keys(job.labels || {}).length ? ["Labels", mapText(job.labels)] : null,
        ["Submitted", fmtDateTime(job.created_at)],
        ["Started", fmtDateTime(job.started_at)],
        job.finished_at ? ["Finished", fmtDateTime(job.finished_at)] : null,
      ]));
  };

  const refreshJob = async () => {
    try {
      job = await api(`/api/v1/jobs/${jobId}`);
    } catch (err) {
      if (err instanceof ApiError && (err.status === 404 || err.status === 403)) {
        stopped = true;
        clear(root, h("div", { class: "card", id: "job-missing" },
          h("h1", {}, err.status === 404 ? `Job #${jobId} not found` : `Job #${jobId} is not visible to you`),
          h("p", { class: "muted" }, err.status === 404 ? "There is no job with this number." : `${err.message}.`),
          h("a", { href: "#/queue" }, "← Back to the queue")));
        return;
      }
      throw err;
    }
    efficiency = await optional(`/api/v1/jobs/${jobId}/efficiency`, {}, null);
    // Why the jobs ahead go first (as sprio), as the last full cycle ranked them: asked
    // again when the position moved or every 10 s. Not for jobs outside the ranking.
    const ranked = job.status === "PENDING" && !job.held_by && !NOT_RANKED.has(job.pending_reason);
    if (!ranked) rank = null;
    else if (!rank || rankFor !== job.queue_position || Date.now() - rankAt > 10_000) {
      rankAt = Date.now();
      rankFor = job.queue_position;
      rank = await api(`/api/v1/jobs/${jobId}/rank`).catch(() => null);
    }
    // Kept fresh after the job ends: its end message is sent, or retried, after that.
    if (job.notify_url || notifications.length) notifications = await api(`/api/v1/jobs/${jobId}/notifications`);
    renderHead();
    renderSpec();
  };

  // Change a pending job (PATCH, as scontrol update): only the fields edited are sent, and
  // the server's 422 message is shown next to its field.
  const EDITABLE = [
    ["priority", "Priority", "-1000 … 1000"],
    ["gpus", "GPUs per node", ""],
    ["max_runtime_s", "Max runtime (s)", "empty: no limit"],
    ["estimated_runtime_s", "Estimated runtime (s)", "empty: unknown"],
    ["grace_s", "Grace to checkpoint (s)", "empty: the node's default"],
  ];
  // A task's page also changes its array's limit (PATCH /jobs/{id}/array), for every task.
  const current = (name) => (name === "max_running" ? job.array.max_running : job[name]) ?? null;
  // A placed job takes only a new time limit (scontrol update TimeLimit=), counted from its
  // start: its owner may shorten it, only an admin extend it.
  const PLACED_EDITABLE = [["max_runtime_s", "Max runtime (s)", "from its start; only an admin extends it"]];
  let editorMode = null;
  const closeEditor = () => { editor.hidden = true; editorMode = null; clear(editor); };
  const openEditor = () => {
    editorMode = placed(job) ? "placed" : "pending";
    const fields = editorMode === "placed" ? PLACED_EDITABLE : job.array
      ? [...EDITABLE, ["max_running", "Tasks of its array at once", `empty: no limit; for all ${job.array.tasks} tasks`]]
      : EDITABLE;
    const inputs = Object.fromEntries(fields.map(([name]) => [name,
      h("input", { type: "number", inputmode: "numeric", id: `c-${name}`, value: current(name) ?? "" })]));
    // Its dependencies (scontrol update Dependency=): other jobs, how they must end, or none.
    const waitsFor = h("input", {
      type: "text", inputmode: "numeric", id: "c-depends_on", placeholder: "none", value: job.depends_on.join(", "),
    });
    const how = h("select", { id: "c-dependency" },
      [...DEPENDENCY_KINDS, ["singleton", "one job of its name at a time (no jobs named)"]].map(([value, label]) =>
        h("option", { value, selected: value === job.dependency }, label)));
    const errors = Object.fromEntries([...fields, ["depends_on"], ["dependency"]].map(([name]) => [name,
      h("div", { class: "field-error", id: `cerr-${name}`, role: "alert", hidden: true })]));
    const general = h("div", { class: "error-box", role: "alert", hidden: true });
    // scontrol update of an array id: the same change for every pending task, or none.
    const allTasks = job.array && editorMode === "pending" ? h("input", { type: "checkbox", id: "c-all-tasks" }) : null;
    const save = async (ev) => {
      ev.preventDefault();
      hideFieldErrors(errors, general);
      const changes = changedNumbers(fields, inputs, current);
      const ids = editorMode === "pending" ? waitsFor.value.split(/[\s,]+/).filter(Boolean) : job.depends_on.map(String);
      const notId = ids.find((id) => !/^[1-9]\d*$/.test(id));
      if (notId) {
        errors.depends_on.textContent = `"${notId}" is not a job id`;
        errors.depends_on.hidden = false;
        return;
      }
      if (editorMode === "pending" && (how.value !== job.dependency || ids.join() !== job.depends_on.join())) {
        changes.depends_on = ids.map(Number);
        changes.dependency = how.value;
      }
      const { max_running: limit, ...jobChanges } = changes;
      if (!Object.keys(changes).length) { closeEditor(); return; }
      try {
        let changed = `Job ${jobId} changed`;
        if (Object.keys(jobChanges).length && allTasks?.checked) {
          const done = await api("/api/v1/jobs", { method: "PATCH", body: jobChanges, query: { array: job.array.id } });
          changed = `${done.count} pending task${done.count === 1 ? "" : "s"} of array ${job.array.id} changed`;
        } else if (Object.keys(jobChanges).length) {
          await api(`/api/v1/jobs/${jobId}`, { method: "PATCH", body: jobChanges });
        }
        if ("max_running" in changes) {
          await api(`/api/v1/jobs/${jobId}/array`, { method: "PATCH", body: { max_running: limit } });
        }
        toast(changed);
        closeEditor();
        await Promise.all([refreshJob(), refreshEvents()]);
      } catch (err) {
        showFieldErrors(err, errors, general);
      }
    };
    clear(editor, h("h2", {}, "Change this job"),
      h("form", { onsubmit: save, novalidate: true },
        h("div", { class: "form-grid" }, fields.map(([name, label, help]) => h("div", { class: "field span-2" },
          h("label", { for: `c-${name}` }, label), inputs[name],
          help ? h("div", { class: "help" }, help) : null, errors[name])),
          editorMode === "pending" ? [
            h("div", { class: "field span-2" }, h("label", { for: "c-depends_on" }, "Waits for jobs"), waitsFor,
              h("div", { class: "help" }, "ids, e.g. 12, 13; empty: none"), errors.depends_on),
            h("div", { class: "field span-2" }, h("label", { for: "c-dependency" }, "…ended how"), how,
              errors.dependency)] : null),
        allTasks ? h("label", { class: "check", style: { marginTop: ".9rem" }, title: "As scontrol update of the array's id" }, allTasks,
          `Change every pending task of array ${job.array.id} (all or none)`) : null,
        general,
        h("p", { class: "small muted" }, editorMode === "pending"
          ? "It keeps its submit time; the next cycle ranks it anew."
          : "Counted from its start; its node is told at once."),
        h("div", { class: "form-actions" },
          h("button", { type: "submit", class: "btn btn-primary btn-sm", id: "save-change" }, "Save"),
          h("button", { type: "button", class: "btn btn-ghost btn-sm", onclick: closeEditor }, "Close"))));
    editor.hidden = false;
    inputs[fields[0][0]].focus();
  };

  const refreshEvents = async () => {
    const list = timeline(await api(`/api/v1/jobs/${jobId}/events`));
    clear(events, h("h2", {}, "Timeline"),
      list.length ? h("ol", { class: "timeline" }, list.map((e) => h("li", { dataset: { to: e.to_status } },
        h("div", { class: "what" }, e.from_status && e.from_status !== e.to_status ? `${e.from_status} → ` : "", h("b", {}, e.to_status),
          e.reason ? ` · ${e.reason}` : ""),
        h("div", { class: "when" }, `${fmtDateTime(e.at)} · ${e.actor}${e.attempt ? ` · attempt ${e.attempt}` : ""}`)))) : h("div", { class: "empty" }, "No events."));
  };

  const nodeLog = (rank) => api(`/api/v1/jobs/${jobId}/logs`,
    { query: { tail: 200, ...(rank > 0 ? { node_rank: rank } : {}) }, text: true });
  // Every node's log, each line prefixed with its rank, as `gpusched logs --label` (srun --label).
  const labelledLogs = async (nodes) => {
    const texts = await Promise.all(Array.from({ length: nodes }, (_, rank) => nodeLog(rank)));
    return texts.map((text, rank) => text.split("\n").filter((line, i, all) => line || i < all.length - 1)
      .map((line) => `${rank}: ${line}\n`).join("")).join("");
  };

  const refreshLog = async () => {
    if (job && job.nodes > 1 && logNode.options.length !== job.nodes + 1) {
      clear(logNode, ...Array.from({ length: job.nodes }, (_, rank) => h("option", { value: String(rank) }, `node ${rank}`)),
        h("option", { value: "all" }, "all nodes"));
      logNode.hidden = false;
    }
    const text = logNode.value === "all" ? await labelledLogs(job.nodes) : await nodeLog(Number(logNode.value) || 0);
    const atBottom = logPre.scrollHeight - logPre.scrollTop - logPre.clientHeight < 30;
    const running = job && ACTIVE.has(job.status);
    const shown = text || (job && job.attempt === 0
      ? (running ? "The job has not started yet." : "The job never started.")
      : (running ? "(no output yet)" : "(no output)"));
    if (logPre.textContent !== shown) {  // compare what is shown: an empty log gets its note too
      logPre.textContent = shown;
      if (atBottom) logPre.scrollTop = logPre.scrollHeight;
    }
    logNote.textContent = running ? "live · last 200 lines" : "last 200 lines";
  };

  const refreshTelemetry = async () => {
    const data = await optional(`/api/v1/jobs/${jobId}/telemetry`, {}, null);
    if (data === null) {
      chart.setHidden(true);
      memoryChart.setHidden(true);
      chartNote.textContent = "Per-job telemetry is not available on this server.";
      return;
    }
    const points = perSample(data.points || []);
    if (!memoryTotal && points.length) {
      memoryTotal = await gpuMemory(job);
      memoryChart.redraw();
    }
    // Without samples (not started, or none taken) the note alone, not two empty charts.
    chart.setHidden(!points.length);
    memoryChart.setHidden(!points.length);
    chart.setData(columns(points, ["util_pct"]));
    memoryChart.setData(columns(points, ["memory_used_mb"]));
    chartNote.textContent = points.length ? ""
      : job && !ACTIVE.has(job.status) ? "No samples: none was taken while the job ran."
      : "No samples yet: telemetry appears while the job runs.";
  };

  // One loop: fast while the job is active, then a final refresh and stop.
  let finalDone = false;
  const loop = async () => {
    if (stopped) return;
    await refreshJob();
    if (stopped) return;
    const active = ACTIVE.has(job.status) || job.status === "PREEMPTED" || job.status === "LOST";
    if (!active && finalDone) return;
    await Promise.all([refreshEvents(), refreshLog(), refreshTelemetry()]);
    if (!active) finalDone = true;
  };
  const stop = poll(loop, 2000);
  return () => {
    stopped = true;
    stop();
    chart.destroy();
    memoryChart.destroy();
  };
}

/**
 * The events as a timeline. A stopped attempt that goes back to the queue passes through
 * PREEMPTED in the same instant, whoever stopped it: the scheduler for another job, its
 * owner (requeue), or its node's agent shutting down. Shown as the one change it is,
 * RUNNING → PENDING with both reasons; a preemption's own note ("preempting for job N")
 * stays above it.
 */
export function timeline(events) {
  const out = [];
  for (const e of events) {
    const last = out[out.length - 1];
    if (last && last.to_status === "PREEMPTED" && e.from_status === "PREEMPTED" && e.to_status === "PENDING") {
      out[out.length - 1] = { ...e, from_status: last.from_status, reason: [last.reason, e.reason].filter(Boolean).join("; ") };
    } else {
      out.push(e);
    }
  }
  return out;
}

/** Where the job is placed, or, for one not placed now, where its latest attempt was. */
function placedOn(job) {
  const mono = (allocations) => h("span", { class: "mono", id: "job-placed" }, allocationText({ allocations }));
  if (job.allocations.length || !(job.last_allocations || []).length) return ["Placed on", mono(job.allocations)];
  const attempt = job.attempt > 1 ? ` (attempt ${job.attempt})` : "";
  // A job that went back to the queue before it started (its node lost it) never ran there.
  const label = job.status === "PENDING" ? "Last placed on" : job.started_at ? "Ran on" : "Placed on";
  return [label, h("span", {}, mono(job.last_allocations), attempt)];
}

/** One point per sample time: the mean utilisation and the summed memory of the job's GPUs
 * (the endpoint gives a point per GPU and sample; GPUs of a node share the sample time,
 * those of other nodes fall in the same sample interval). */
export function perSample(points) {
  const byTime = new Map();
  for (const p of points) {
    const step = (p.resolution_s || 5) * 1000;
    const at = Math.floor(Date.parse(p.at) / step) * step;
    const group = byTime.get(at) || { utils: [], memory: 0 };
    if (p.util_pct !== null && p.util_pct !== undefined) group.utils.push(p.util_pct);
    group.memory += p.memory_used_mb || 0;
    byTime.set(at, group);
  }
  return [...byTime.entries()].sort((a, b) => a[0] - b[0]).map(([at, g]) => ({
    at: new Date(at).toISOString(),
    util_pct: g.utils.length ? g.utils.reduce((a, b) => a + b, 0) / g.utils.length : null,
    memory_used_mb: g.memory,
  }));
}

/** MiB of memory of the GPUs the job holds or held (0 when its nodes are gone). */
async function gpuMemory(job) {
  const held = job.allocations.length ? job.allocations : job.last_allocations || [];
  if (!held.length) return 0;
  const nodes = await api("/api/v1/nodes");
  const total = new Map(nodes.flatMap((n) => n.gpus.map((g) => [`${n.name}:${g.index}`, g.memory_total_mb])));
  return held.reduce((sum, a) => sum + (total.get(`${a.node}:${a.gpu_index}`) || 0), 0);
}
