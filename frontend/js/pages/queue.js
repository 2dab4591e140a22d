// Queue: pending jobs in scheduling order (offset pagination from /queue) and active jobs
// (cursor pagination from /jobs). Only one page of each is ever in the DOM.
import { api } from "../api.js";
import {
  allocationText, CANCELLABLE, cardify, clear, fmtAgo, fmtDateTime, fmtDuration, fmtIn, fmtNum, gpuRequest,
  h, jobName, pendingText, poll, reasonLabel, statusBadge, toast,
} from "../util.js";

const PAGE = 50;

/** A two-step button (no blocking confirm() dialog): the first click arms it for 4 s. */
export function confirmButton({ label, dataset, aria, danger, onConfirm }) {
  let armed = false;
  let timer = null;
  const btn = h("button", {
    type: "button", class: `btn ${danger ? "btn-danger" : "btn-ghost"} btn-sm`, dataset, "aria-label": aria,
    onclick: async () => {
      if (!armed) {
        armed = true;
        btn.textContent = `Confirm ${label.toLowerCase()}`;
        btn.classList.add("armed");
        timer = setTimeout(() => { armed = false; btn.textContent = label; btn.classList.remove("armed"); }, 4000);
        return;
      }
      clearTimeout(timer);
      btn.classList.remove("armed");
      btn.disabled = true;
      await onConfirm();
    },
  }, label);
  return btn;
}

export function cancelButton(job, onDone) {
  if (!CANCELLABLE.has(job.status)) return null;
  if (job.cancel_requested) return killButton(job, onDone);
  return confirmButton({
    label: "Cancel", dataset: { cancel: job.id }, aria: `Cancel job ${job.id}`, danger: true,
    onConfirm: async () => {
      try {
        const after = await api(`/api/v1/jobs/${job.id}/cancel`, { method: "POST" });
        // A running job is only asked to stop: it ends once its process has exited.
        toast(after.status === "CANCELLED" ? `Job ${job.id} cancelled` : `Job ${job.id} is stopping`);
      } catch (err) {
        toast(`Cannot cancel job ${job.id}: ${err.message}`, "error");
      }
      onDone();
    },
  });
}

// Every task of this job's array that has not ended, in one request (scancel of an array
// id). Shown on any task: the others may still be waiting or running.
export function cancelArrayButton(job, onDone) {
  if (!job.array) return null;
  const id = job.array.id;
  return confirmButton({
    label: "Cancel array", dataset: { cancelArray: id }, aria: `Cancel every task of array ${id}`, danger: true,
    onConfirm: async () => {
      try {
        // Counts and ids, not the tasks themselves (an array may have 100,000).
        const done = await api("/api/v1/jobs/cancel", { method: "POST", query: { array: id } });
        const stopping = done.stopping;
        const cancelled = done.count - stopping;
        toast(done.count
          ? `Array ${id}: ${cancelled} task${cancelled === 1 ? "" : "s"} cancelled, ${stopping} stopping`
          : `Array ${id} has no task left to cancel`);
      } catch (err) {
        toast(`Cannot cancel array ${id}: ${err.message}`, "error");
      }
      onDone();
    },
  });
}

// Requeue (scontrol requeue): stop a placed or running job (SIGTERM, its grace period to checkpoint)
// and put it back in the queue with its age; it costs no retry.
export function requeueButton(job, onDone) {
  if (!["SCHEDULED", "RUNNING"].includes(job.status) || job.cancel_requested) return null;
  if (job.requeue_requested) return h("span", { class: "badge warn", id: "requeuing" }, "requeuing…");
  return confirmButton({
    label: "Requeue", dataset: { requeue: job.id }, aria: `Requeue job ${job.id}`, danger: false,
    onConfirm: async () => {
      try {
        await api(`/api/v1/jobs/${job.id}/requeue`, { method: "POST" });
        toast(`Job ${job.id} is stopping; it goes back in the queue`);
      } catch (err) {
        toast(`Cannot requeue job ${job.id}: ${err.message}`, "error");
      }
      onDone();
    },
  });
}

// A cancelled job is stopping: SIGTERM sent, its grace period running. One that does not
// exit (a hung checkpoint) can be killed at once: cancel again with grace 0 (SIGKILL).
function killButton(job, onDone) {
  const btn = h("button", {
    type: "button", class: "btn btn-danger btn-sm", dataset: { kill: job.id },
    "aria-label": `Kill job ${job.id} now`, title: "SIGKILL now, without waiting for its grace period",
    onclick: async () => {
      btn.disabled = true;
      try {
        await api(`/api/v1/jobs/${job.id}/cancel?grace_s=0`, { method: "POST" });
        toast(`Job ${job.id}: SIGKILL sent`);
      } catch (err) {
        toast(`Cannot kill job ${job.id}: ${err.message}`, "error");
      }
      onDone();
    },
  }, "Kill now");
  return h("span", { class: "stopping" }, h("span", { class: "badge warn" }, "stopping…"), " ", btn);
}

// Hold (scontrol hold) keeps a pending job from starting; Release lets it run again.
export function holdButton(job, onDone) {
  if (job.status !== "PENDING") return null;
  const action = job.held_by ? "release" : "hold";
  const label = job.held_by ? "Release" : "Hold";
  const btn = h("button", {
    type: "button", class: "btn btn-ghost btn-sm", dataset: { [action]: job.id },
    "aria-label": `${label} job ${job.id}`,
    onclick: async () => {
      btn.disabled = true;
      try {
        await api(`/api/v1/jobs/${job.id}/${action}`, { method: "POST" });
        toast(`Job ${job.id} ${job.held_by ? "released" : "held"}`);
      } catch (err) {
        toast(`Cannot ${action} job ${job.id}: ${err.message}`, "error");
      }
      onDone();
    },
  }, label);
  return btn;
}

// Hold every pending task of this job's array, or release every held one, in one request
// (scontrol hold/release of an array id): release when this task is held, else hold.
export function holdArrayButton(job, onDone) {
  if (!job.array) return null;
  const id = job.array.id;
  const action = job.held_by ? "release" : "hold";
  const label = job.held_by ? "Release array" : "Hold array";
  const btn = h("button", {
    type: "button", class: "btn btn-ghost btn-sm", dataset: { [`${action}Array`]: id },
    "aria-label": `${label}: every ${action === "hold" ? "pending" : "held"} task of array ${id}`,
    onclick: async () => {
      btn.disabled = true;
      try {
        const done = await api(`/api/v1/jobs/${action}`, { method: "POST", query: { array: id } });
        const n = done.count;
        toast(n
          ? `Array ${id}: ${n} task${n === 1 ? "" : "s"} ${action === "hold" ? "held" : "released"}`
          : `Array ${id} has no ${action === "hold" ? "pending" : "held"} task`);
      } catch (err) {
        toast(`Cannot ${action} array ${id}: ${err.message}`, "error");
      }
      onDone();
    },
  }, label);
  return btn;
}

// Its estimated start, or why none can be given (the API's estimate_note), shown short
// with the whole note on hover.
function estimateCell(job) {
  if (job.estimated_start_at) {
    return h("td", { class: "hide-sm est", title: fmtDateTime(job.estimated_start_at) }, fmtIn(job.estimated_start_at));
  }
  const note = job.estimate_note || "";
  const short = note.startsWith("no estimate yet") ? "next cycle" : "—";
  return h("td", { class: "hide-sm est", title: note || undefined }, short);
}

function jobLink(job) {
  return h("a", { href: `#/jobs/${job.id}`, class: "mono" }, `#${job.id}`);
}

export function queuePage(root, ctx, { params }) {
  const state = {
    project: params.get("project") || "",
    status: params.get("status") || "",
    user: params.get("user") || "",
    name: params.get("name") || "",
    offset: Math.max(0, Number(params.get("offset")) || 0),
    laterOffset: Math.max(0, Number(params.get("later_offset")) || 0),
    cursors: [null], // cursor stack for the active list; last = current page
  };
  const projectSelect = h("select", { id: "filter-project" }, h("option", { value: "" }, "All projects"));
  const statusSelect = h("select", { id: "filter-status" },
    [["", "Pending and active"], ["PENDING", "Pending"], ["RUNNING", "Running"], ["SCHEDULED", "Scheduled"]]
      .map(([v, t]) => h("option", { value: v }, t)));
  statusSelect.value = state.status;
  // As squeue -u / --name: exact names, applied on Enter or leaving the field.
  const userInput = h("input", { id: "filter-user", type: "search", placeholder: "any", value: state.user, autocomplete: "off" });
  const nameInput = h("input", { id: "filter-name", type: "search", placeholder: "any", value: state.name, autocomplete: "off" });
  // Waiting jobs in two sections, as Slurm keeps jobs that are not yet eligible out of
  // its passes: first those that may run now, in line; then those that cannot yet (held,
  // waiting for dependencies, a begin time, a window or their array's limit), which
  // would otherwise fill the first pages of a deep queue.
  const pendingCard = h("section", { class: "card", id: "pending" });
  const laterCard = h("section", { class: "card", id: "later" });
  const activeCard = h("section", { class: "card", id: "active" });
  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Queue"),
      h("a", { class: "btn btn-primary", href: "#/submit" }, "Submit a job")),
    h("div", { class: "card" }, h("div", { class: "filters" },
      h("div", { class: "field" }, h("label", { for: "filter-project" }, "Project"), projectSelect),
      h("div", { class: "field" }, h("label", { for: "filter-status" }, "Status"), statusSelect),
      h("div", { class: "field" }, h("label", { for: "filter-user" }, "User"), userInput),
      h("div", { class: "field" }, h("label", { for: "filter-name" }, "Job name"), nameInput))),
    pendingCard,
    laterCard,
    activeCard,
  );

  const projectsKnown = new Set();
  const addProjects = (names) => {
    for (const name of names) {
      if (projectsKnown.has(name)) continue;
      projectsKnown.add(name);
      projectSelect.append(h("option", { value: name }, name));
    }
    projectSelect.value = state.project;
  };
  addProjects([...(ctx.me?.projects || []), state.project].filter(Boolean));
  api("/api/v1/queues").then((qs) => addProjects(qs.map((q) => q.project))).catch(() => {});

  const syncHash = () => {
    const q = new URLSearchParams();
    if (state.project) q.set("project", state.project);
    if (state.status) q.set("status", state.status);
    if (state.user) q.set("user", state.user);
    if (state.name) q.set("name", state.name);
    if (state.offset) q.set("offset", state.offset);
    if (state.laterOffset) q.set("later_offset", state.laterOffset);
    const next = `#/queue${q.toString() ? `?${q}` : ""}`;
    if (window.location.hash !== next) history.replaceState(null, "", next);
  };
  const onFilter = (control, key) => control.addEventListener("change", () => {
    state[key] = control.value.trim();
    state.offset = 0;
    state.laterOffset = 0;
    state.cursors = [null];
    syncHash();
    refreshAll();
  });
  onFilter(projectSelect, "project");
  onFilter(statusSelect, "status");
  onFilter(userInput, "user");
  onFilter(nameInput, "name");
  const filters = () => ({ project: state.project, user: state.user, name: state.name });

  // One section of waiting jobs: `id` names its card and its parts (#pending-table, ...),
  // `offsetKey` its page in `state`, `eligible` the API's filter.
  const waitingSection = ({ card, id, offsetKey, eligible, title, note, empty }) => {
    let seq = 0;
    const refresh = async () => {
      if (state.status && state.status !== "PENDING") {
        card.hidden = true;
        return;
      }
      const mine = ++seq;
      const page = await api("/api/v1/queue", {
        query: { offset: state[offsetKey], limit: PAGE, eligible, ...filters() },
      });
      if (mine !== seq) return; // a newer request (filter change) won
      if (state[offsetKey] && state[offsetKey] >= page.total && page.total > 0) {
        state[offsetKey] = Math.floor((page.total - 1) / PAGE) * PAGE;
        syncHash();
        return refresh();
      }
      // The second section only when it has jobs; the first always (it says "none").
      card.hidden = !eligible && page.total === 0;
      render(page);
    };

    const turnPage = (fromTop) => {
      syncHash();
      refresh().catch((err) => toast(err.message, "error"));
      if (!fromTop) card.scrollIntoView({ block: "start" });
    };

    const render = (page) => {
      if (card.querySelector(".armed")) return; // do not redraw under a pending click
      const offset = state[offsetKey];
      const from = page.total ? offset + 1 : 0;
      const to = offset + page.items.length;
      // The same pager above and below the table; only the top one carries ids.
      const pager = (top) => h("div", { class: top ? "pager pager-top" : "pager" },
        h("span", { class: "small muted", id: top ? `${id}-range` : null },
          `${fmtNum(from)}–${fmtNum(to)} of ${fmtNum(page.total)}`),
        h("div", { class: "btns" },
          h("button", {
            type: "button", class: "btn btn-sm", id: top ? `${id}-prev` : null, disabled: offset === 0,
            onclick: () => { state[offsetKey] = Math.max(0, offset - PAGE); turnPage(top); },
          }, "← Previous"),
          h("button", {
            type: "button", class: "btn btn-sm", id: top ? `${id}-next` : null, disabled: to >= page.total,
            onclick: () => { state[offsetKey] = offset + PAGE; turnPage(top); },
          }, "Next →")));
      clear(card,
        h("div", { class: "card-head" },
          h("div", {},
            h("h2", {}, `${title} `, h("span", { class: "muted", id: `${id}-total` }, `(${fmtNum(page.total)})`)),
            h("div", { class: "small muted" }, note)),
          page.total > PAGE ? pager(true) : null),
        page.items.length
          ? h("div", { class: "table-wrap" }, cardify(h("table", { id: `${id}-table` },
            h("thead", {}, h("tr", {},
              h("th", { class: "num" }, "Pos"), h("th", {}, "Job"), h("th", {}, "Name"),
              h("th", { class: "hide-sm" }, "Project"), h("th", { class: "hide-sm" }, "User"),
              h("th", {}, "Request"), h("th", { class: "num hide-sm" }, "Prio"),
              h("th", {}, "Reason"), h("th", { class: "hide-sm" }, "Est. start"),
              h("th", { class: "hide-sm" }, "Submitted"), h("th", {}, ""))),
            h("tbody", {}, page.items.map((job) => h("tr", { dataset: { job: job.id } },
              h("td", { class: "num" }, job.queue_position ?? "—"),
              h("td", {}, jobLink(job)),
              h("td", {}, jobName(job)),
              h("td", { class: "hide-sm" }, job.project),
              h("td", { class: "hide-sm" }, job.user),
              h("td", {}, gpuRequest(job)),
              h("td", { class: "num hide-sm" }, job.priority),
              h("td", { class: "reason wide" },
                job.pending_reason ? h("span", { class: "badge warn" }, reasonLabel(job.pending_reason)) : "—",
                job.pending_message ? h("div", { class: "reason-msg" }, pendingText(job)) : null),
              estimateCell(job),
              h("td", { class: "hide-sm" }, fmtAgo(job.created_at)),
              h("td", { class: "actions" }, holdButton(job, refreshAll), cancelButton(job, refreshAll))))))))
          : h("div", { class: "empty" }, state.user || state.name ? `${empty} match the filters.` : `${empty}.`),
        page.total > PAGE ? pager(false) : null);
    };
    return refresh;
  };
  const refreshRunnable = waitingSection({
    card: pendingCard, id: "pending", offsetKey: "offset", eligible: true,
    title: "Pending", note: "may run now, in scheduling order", empty: "No pending jobs that may run now",
  });
  const refreshLater = waitingSection({
    card: laterCard, id: "later", offsetKey: "laterOffset", eligible: false,
    title: "Not yet eligible", note: "held, waiting for dependencies, a begin time, a window or their array's limit",
    empty: "No jobs waiting for something else",
  });
  const refreshPending = () => Promise.all([refreshRunnable(), refreshLater()]);

  let activeSeq = 0;
  const refreshActive = async () => {
    if (state.status === "PENDING") {
      activeCard.hidden = true;
      return;
    }
    activeCard.hidden = false;
    const seq = ++activeSeq;
    const statuses = state.status ? [state.status] : ["RUNNING", "SCHEDULED"];
    const cursor = state.cursors[state.cursors.length - 1];
    const page = await api("/api/v1/jobs", {
      query: { status: statuses, ...filters(), limit: PAGE, cursor },
    });
    if (seq !== activeSeq) return;
    renderActive(page);
  };

  const renderActive = (page) => {
    if (activeCard.querySelector(".armed")) return;
    const pageNo = state.cursors.length;
    clear(activeCard,
      h("div", { class: "card-head" }, h("h2", {}, state.status === "SCHEDULED" ? "Scheduled" : state.status === "RUNNING" ? "Running" : "Running and scheduled")),
      page.items.length
        ? h("div", { class: "table-wrap" }, cardify(h("table", { id: "active-table" },
          h("thead", {}, h("tr", {},
            h("th", {}, "Job"), h("th", {}, "Name"), h("th", {}, "Status"),
            h("th", { class: "hide-sm" }, "Project"), h("th", { class: "hide-sm" }, "User"),
            h("th", {}, "GPUs"), h("th", { class: "hide-sm" }, "Started"), h("th", { class: "num" }, "Elapsed"),
            h("th", {}, ""))),
          h("tbody", {}, page.items.map((job) => h("tr", { dataset: { job: job.id } },
            h("td", {}, jobLink(job)),
            h("td", {}, jobName(job)),
            h("td", {}, statusBadge(job.status),
              // Preempted or requeued: stopping within its grace, then back in the queue.
              job.requeue_requested && !job.cancel_requested ? h("span", { class: "badge warn", title: "stopping, then back in the queue" }, " requeuing…") : null),
            h("td", { class: "hide-sm" }, job.project),
            h("td", { class: "hide-sm" }, job.user),
            h("td", { class: "mono small" }, allocationText(job)),
            h("td", { class: "hide-sm" }, fmtDateTime(job.started_at || job.scheduled_at)),
            h("td", { class: "num", dataset: { since: job.started_at || "" } },
              job.started_at ? fmtDuration((Date.now() - Date.parse(job.started_at)) / 1000) : "—"),
            // The status cell already says "requeuing…" for a job being requeued.
            h("td", { class: "actions" }, job.requeue_requested ? null : requeueButton(job, refreshAll),
              cancelButton(job, refreshAll))))))))
        : h("div", { class: "empty" }, "No running jobs."),
      pageNo > 1 || page.next_cursor ? h("div", { class: "pager" },
        h("span", { class: "small muted" }, `Page ${pageNo}`),
        h("div", { class: "btns" },
          h("button", {
            type: "button", class: "btn btn-sm", disabled: pageNo === 1,
            onclick: () => { state.cursors.pop(); refreshActive(); },
          }, "← Newer"),
          h("button", {
            type: "button", class: "btn btn-sm", disabled: !page.next_cursor,
            onclick: () => { state.cursors.push(page.next_cursor); refreshActive(); },
          }, "Older →"))) : null);
  };

  const refreshAll = () => Promise.all([refreshPending(), refreshActive()]).catch((err) => {
    if (err.status !== 401) toast(err.message, "error");
  });

  const stop = poll(() => Promise.all([refreshPending(), refreshActive()]), 4000);
  // Elapsed times tick every second without refetching.
  const ticker = setInterval(() => {
    for (const cell of activeCard.querySelectorAll("td[data-since]")) {
      if (cell.dataset.since) cell.textContent = fmtDuration((Date.now() - Date.parse(cell.dataset.since)) / 1000);
    }
  }, 1000);
  return () => {
    stop();
    clearInterval(ticker);
  };
}
