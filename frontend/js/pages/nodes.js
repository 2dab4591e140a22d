// Nodes: one tile per GPU with live telemetry; drain/undrain for admins, and removing a
// decommissioned node (one whose agent has stopped).
import { api } from "../api.js";
import { clear, fmtAgo, fmtDateTime, fmtClock, fmtMem, fmtNum, h, poll, statusBadge, toast } from "../util.js";
import { gpuState } from "./overview.js";
import { confirmButton } from "./queue.js";

const STATE_LABEL = { busy: "busy", idle: "idle", foreign: "foreign use", down: "down" };

function meter(label, pct, text, cls = "") {
  const clamped = Math.max(0, Math.min(100, pct || 0));
  return h("div", { class: "meter" },
    h("div", { class: "meter-row" }, h("span", {}, label), h("b", {}, text)),
    h("div", { class: `bar ${cls}`, role: "img", "aria-label": `${label} ${text}` },
      h("span", { style: { width: `${clamped}%` } })));
}

function gpuTile(node, gpu) {
  const state = gpuState(node, gpu);
  const memPct = gpu.memory_total_mb ? (100 * (gpu.memory_used_mb || 0)) / gpu.memory_total_mb : 0;
  const foreignProcs = gpu.processes.filter((p) => p.job_id === null || p.job_id === undefined);
  const hot = (gpu.temperature_c || 0) >= 85;
  return h("div", { class: `gpu ${state}`, dataset: { gpu: `${node.name}:${gpu.index}`, state } },
    h("div", { class: "gpu-top" },
      h("div", {}, h("div", { class: "gpu-title" }, `GPU ${gpu.index}`), h("div", { class: "gpu-model" }, gpu.model)),
      h("span", { class: `badge ${state === "busy" ? "busy" : state === "foreign" ? "foreign" : state === "down" ? "danger" : ""}` },
        state === "busy" && gpu.allocated < 1 ? `busy ${Math.round(gpu.allocated * 100)}%` : STATE_LABEL[state])),
    meter("Utilisation", gpu.util_pct, gpu.util_pct === null ? "—" : `${fmtNum(gpu.util_pct)}%`),
    meter("Memory", memPct, `${fmtMem(gpu.memory_used_mb)} / ${fmtMem(gpu.memory_total_mb)}`, "mem"),
    h("div", { class: "gpu-facts" },
      h("span", { class: hot ? "hot" : "" }, "Temp ", h("b", {}, gpu.temperature_c === null ? "—" : `${fmtNum(gpu.temperature_c)} °C`)),
      h("span", {}, "Power ", h("b", {}, gpu.power_w === null ? "—" : `${fmtNum(gpu.power_w)} W`))),
    !gpu.healthy ? h("div", { class: "field-error" }, gpu.health_message || "unhealthy") : null,
    gpu.healthy && gpu.health_message ? h("div", { class: "sub" }, gpu.health_message) : null,
    (gpu.unknown_readings || []).length ? h("div", { class: "field-error", dataset: { unknown: "1" } },
      `unknown, takes no jobs: could not read ${gpu.unknown_readings.join("; ")}`) : null,
    gpu.mig_enabled ? h("div", { class: "field-error", dataset: { mig: "1" } },
      "MIG enabled: slices are not scheduled, so it takes no jobs") : null,
    foreignProcs.length ? h("div", { class: "field-error", dataset: { foreign: "1" } },
      `⚠ ${foreignProcs.length} foreign process${foreignProcs.length > 1 ? "es" : ""}: ${fmtNum(gpu.foreign_util_pct)}% · ${fmtMem(gpu.foreign_memory_mb)}`) : null,
    gpu.processes.length ? h("div", { class: "procs" }, gpu.processes.map((p) => {
      const foreign = p.job_id === null || p.job_id === undefined;
      return h("div", { class: `proc ${foreign ? "foreign" : ""}` },
        h("span", {}, foreign ? `pid ${p.pid ?? "?"} (foreign${p.name ? `: ${p.name}` : ""})` : h("a", { href: `#/jobs/${p.job_id}` }, `job #${p.job_id}`)),
        h("span", {}, fmtMem(p.memory_mb ?? p.used_memory_mb ?? p.memory_used_mb)));
    })) : null);
}

export function nodesPage(root, ctx) {
  const list = h("div", { class: "stack", id: "node-list" });
  const updated = h("span", { class: "sub" });
  root.append(
    h("div", { class: "page-head" }, h("h1", {}, "Nodes"), updated),
    h("div", { class: "card legend-row", style: { marginBottom: "1rem" } },
      h("span", {}, h("span", { class: "swatch", style: { background: "var(--busy)" } }), "busy (allocated to a job)"),
      h("span", {}, h("span", { class: "swatch", style: { background: "var(--idle)" } }), "idle"),
      h("span", {}, h("span", { class: "swatch", style: { background: "var(--foreign)" } }), "used by a foreign process"),
      h("span", {}, h("span", { class: "swatch", style: { background: "var(--danger)" } }), "down / unhealthy")),
    list);

  // is_admin null = unknown (no /me): show the buttons and let a 403 explain.
  const canAdmin = ctx.me?.is_admin !== false;
  const cards = new Map();

  const actions = (node) => {
    if (!canAdmin) return null;
    const box = h("div", { class: "node-actions" });
    const base = `/api/v1/nodes/${encodeURIComponent(node.name)}`;
    const run = async (path, body, what, requeue = false) => {
      try {
        await api(`${base}/${path}`, { method: "POST", body });
        // Requeue: its running jobs stop (with their grace period) and run elsewhere.
        const moved = requeue ? await api(`${base}/requeue`, { method: "POST" }) : null;
        toast(moved ? `${node.name} ${what}; ${moved.length} running job(s) requeued` : `${node.name} ${what}`);
      } catch (err) {
        toast(err.status === 403 ? `Only admins can drain nodes (${err.message})` : err.message, "error");
      }
      box.classList.remove("editing");
      refresh();
    };
    if (node.drained || node.maintenance_at) {
      const planned = !node.drained;  // a maintenance to come: undrain calls it off
      box.append(h("button", { type: "button", class: "btn btn-sm", dataset: { undrain: node.name },
        onclick: () => run("undrain", undefined, planned ? "maintenance called off" : "undrained") },
        planned ? "Call off maintenance" : "Undrain"));
    } else {
      box.append(h("button", {
        type: "button", class: "btn btn-sm btn-danger", dataset: { drain: node.name },
        onclick: () => {
          box.classList.add("editing");
          const reason = h("input", { type: "text", placeholder: "Reason (optional)", maxlength: 255, "aria-label": "Drain reason" });
          const requeue = h("input", { type: "checkbox", name: "requeue" });
          // Empty: now. A time: maintenance from then (only jobs ending by then start).
          const from = h("input", { type: "datetime-local", name: "at", "aria-label": "Drain from (empty: now)",
            title: "Empty: now. A later time plans a maintenance: until then only jobs whose time limit ends by then start here" });
          const submit = (ev) => {
            ev.preventDefault();
            if (!from.value) return run("drain", { reason: reason.value }, "drained", requeue.checked);
            if (requeue.checked) return toast("Requeue applies to a drain now, not to a maintenance later", "error");
            const at = new Date(from.value).toISOString();
            return run("drain", { reason: reason.value, at }, `maintenance from ${fmtDateTime(at)}`);
          };
          clear(box, h("form", { class: "drain-form", onsubmit: submit },
            reason,
            h("label", { class: "drain-at" }, "From", from, h("span", { class: "muted" }, "(empty: now)")),
            h("label", { class: "check", title: "They get their grace period to checkpoint, then run elsewhere" }, requeue, "Requeue its running jobs"),
            h("button", { type: "submit", class: "btn btn-sm btn-danger" }, "Drain"),
            h("button", { type: "button", class: "btn btn-sm", onclick: () => { box.classList.remove("editing"); refresh(); } }, "Cancel")));
          reason.focus();
        },
      }, "Drain…"));
    }
    // Only a node whose agent has stopped: a running agent would bring it back at once.
    if (node.state !== "READY") {
      box.append(confirmButton({
        label: "Remove", dataset: { remove: node.name }, danger: true,
        aria: `Remove node ${node.name} (decommissioned)`,
        onConfirm: async () => {
          try {
            await api(base, { method: "DELETE" });
            toast(`${node.name} removed; its agent registering again brings it back`);
          } catch (err) {
            toast(`Cannot remove ${node.name}: ${err.message}`, "error");
          }
          refresh();
        },
      }));
    }
    return box;
  };

  const renderNode = (node) => {
    // The 4 s poll keeps a node's actions while a drain form is open or a Remove is armed:
    // redrawn, the armed button would forget its first click.
    const oldActions = cards.get(node.name)?.querySelector(".node-actions");
    const keepActions = oldActions && (oldActions.matches(".editing") || oldActions.querySelector(".armed"))
      ? oldActions : null;
    const heartbeat = node.last_heartbeat_at ? `heartbeat ${fmtAgo(node.last_heartbeat_at)}` : "no heartbeat yet";
    const card = h("section", { class: "card", dataset: { node: node.name } },
      h("div", { class: "node-head" },
        h("h2", {}, node.name),
        statusBadge(node.state),
        node.drained ? h("span", { class: "badge warn", title: node.drain_reason }, "drained")
          : node.maintenance_at ? h("span", { class: "badge warn", title: node.drain_reason, dataset: { maintenance: node.name } },
            `maintenance ${fmtDateTime(node.maintenance_at)}`) : null,
        keepActions || actions(node)),
      h("div", { class: "node-meta" },
        `${node.hostname} · ${node.gpu_backend} backend · ${fmtNum(node.gpus_allocated, node.gpus_allocated % 1 ? 1 : 0)} of ${node.gpu_count} GPUs allocated · ${heartbeat}`,
        node.drained && node.drain_reason ? ` · drained: ${node.drain_reason}` : "",
        !node.drained && node.maintenance_at
          ? ` · maintenance from ${fmtDateTime(node.maintenance_at)}, until then only jobs whose time limit ends by then: ${node.drain_reason}` : "",
        node.health_message && node.state !== "READY" ? ` · ${node.health_message}` : ""),
      // How its jobs are fenced, and whose account they run as.
      h("div", { class: "node-meta", dataset: { isolation: node.name } },
        `isolation: ${node.isolation || "unknown"} · `,
        node.jobs_run_as === null || node.jobs_run_as === undefined
          ? "jobs run as their owners' Unix accounts" : `single-user: jobs run as ${node.jobs_run_as}`,
        Object.keys(node.unusable_accounts || {}).length
          ? h("span", { class: "field-error", dataset: { unusable: node.name } }, ` · cannot run jobs as ${Object.entries(node.unusable_accounts)
            .map(([account, why]) => `${account} (${why})`).join(", ")}`) : null),
      h("div", { class: "gpu-grid" }, node.gpus.map((gpu) => gpuTile(node, gpu))));
    cards.set(node.name, card);
    return card;
  };

  const refresh = async () => {
    const nodes = await api("/api/v1/nodes");
    if (!nodes.length) {
      clear(list, h("div", { class: "card empty" }, "No nodes have registered yet. Start an agent to add one."));
      return;
    }
    clear(list, nodes.map(renderNode));
    updated.textContent = `Updated ${fmtClock(new Date())}`;
  };
  return poll(refresh, 4000);
}
