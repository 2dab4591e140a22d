// Windows and batches: off-peak windows of the next 7 days on a timeline; batches with
// their firing history, run now, enable and disable.
import { api, optional } from "../api.js";
import { clear, fmtClock, fmtDateTime, fmtDuration, fmtIn, fmtTick, fmtWeekday, h, poll, toast } from "../util.js";
import { loadWindows } from "./overview.js";

const DAYS = 7;
// A batch's `concurrency`: what a fire time does while jobs of an earlier firing run.
const OVERLAP = { allow: "allowed", forbid: "skip firing", replace: "replace earlier" };
const OVERLAP_HINT = {
  allow: "a fire time submits even while jobs of an earlier firing have not ended",
  forbid: "a fire time is skipped while jobs of an earlier firing have not ended",
  replace: "a fire time cancels the jobs of an earlier firing that have not ended, then submits",
};

function timeline(windows) {
  const start = new Date();
  start.setHours(0, 0, 0, 0);
  const t0 = start.getTime() / 1000;
  const t1 = t0 + DAYS * 86400;
  const now = Date.now() / 1000;
  const pos = (t) => `${(100 * (Math.min(Math.max(t, t0), t1) - t0)) / (t1 - t0)}%`;
  const names = [...new Set(windows.map((w) => w.window))];
  const grid = [];
  const labels = [];
  for (let d = 0; d < DAYS; d += 1) {
    const at = t0 + d * 86400;
    grid.push(h("div", { class: "wt-grid", style: { left: pos(at) } }));
    const day = new Date(at * 1000);
    labels.push(h("span", { style: { left: pos(at) }, title: fmtTick(day, { day: true }) },
      h("span", {}, fmtWeekday(day)), h("span", { class: "hide-sm" }, ` ${day.getDate()}`)));
  }
  return h("div", { class: "wt", id: "windows-timeline" },
    h("div", { class: "wt-axis" }, labels),
    names.map((name) => h("div", { class: "wt-row" },
      grid.map((g) => g.cloneNode()),
      h("span", { class: "wt-label" }, name),
      windows.filter((w) => w.window === name && w.to > t0 && w.from < t1).map((w) => h("div", {
        class: `wt-block ${w.from <= now && w.to > now ? "current" : ""}`,
        style: { left: pos(w.from), width: `calc(${pos(w.to)} - ${pos(w.from)})` },
        title: `${w.window}: ${fmtDateTime(w.opens_at)} – ${fmtDateTime(w.closes_at)}`,
      })),
      h("div", { class: "wt-now", style: { left: pos(now) }, title: "now" }))));
}

export function windowsPage(root, ctx) {
  const winCard = h("section", { class: "card", id: "windows" });
  const batchCard = h("section", { class: "card", id: "batches" });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Off-peak windows and batches")), winCard, batchCard);

  const refreshWindows = async () => {
    const windows = await loadWindows(DAYS);
    if (windows === null || !windows.length) {
      clear(winCard, h("h2", {}, "Next 7 days"),
        h("div", { class: "notice", id: "no-windows" }, "No off-peak windows configured. An admin creates one with ",
          h("code", {}, "gpusched window create night --tz Europe/Berlin --daily '22:00-06:00'"), "."));
      return;
    }
    const now = Date.now() / 1000;
    clear(winCard,
      h("div", { class: "card-head" }, h("h2", {}, "Next 7 days"),
        h("span", { class: "small muted" }, "red line: now")),
      timeline(windows),
      h("div", { class: "table-wrap", style: { marginTop: "1rem" } }, h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "Window"), h("th", {}, "Opens"), h("th", {}, "Closes"), h("th", { class: "hide-sm" }, "Length"), h("th", {}, ""))),
        h("tbody", {}, windows.slice(0, 30).map((w) => h("tr", {},
          h("td", {}, w.window),
          h("td", {}, fmtDateTime(w.opens_at)),
          h("td", {}, fmtDateTime(w.closes_at)),
          h("td", { class: "hide-sm" }, fmtDuration(w.to - w.from)),
          h("td", {}, w.from <= now && w.to > now ? h("span", { class: "badge ok" }, "open now")
            : h("span", { class: "small muted" }, fmtIn(w.opens_at)))))))));
  };

  // Batches whose firing history is shown; it stays open across refreshes.
  const opened = new Set();
  // is_admin null = unknown (no /me): show the buttons and let a 403 explain.
  const manages = (b) => ctx.me?.is_admin !== false || b.owner === ctx.me?.name;
  const act = async (b, path, done) => {
    try {
      const out = await api(`/api/v1/batches/${encodeURIComponent(b.name)}/${path}`, { method: "POST" });
      toast(done(out));
      if (path === "run") opened.add(b.name);
    } catch (err) {
      toast(err.message, "error");
    }
    refreshBatches();
  };
  const actions = (b) => manages(b) ? h("td", { class: "actions" },
    h("button", {
      type: "button", class: "btn btn-sm", dataset: { run: b.name },
      title: "Submit its jobs now; its schedule stays as it is (kubectl create job --from=cronjob)",
      onclick: () => act(b, "run", (f) => `${b.name}: job${f.job_ids.length > 1 ? "s" : ""} ${f.job_ids.join(", ")} submitted`),
    }, "Run now"),
    " ",
    h("button", {
      type: "button", class: "btn btn-sm btn-ghost", dataset: { [b.enabled ? "disable" : "enable"]: b.name },
      onclick: () => act(b, b.enabled ? "disable" : "enable", (out) => `${b.name} ${out.enabled ? "enabled" : "disabled"}`),
    }, b.enabled ? "Disable" : "Enable")) : h("td", {});

  const refreshBatches = async () => {
    const data = await optional("/api/v1/batches", {}, null);
    const items = data === null ? null : Array.isArray(data) ? data : data.items || [];
    if (items === null || !items.length) {
      clear(batchCard, h("h2", {}, "Batches"),
        h("div", { class: "notice", id: "no-batches" },
          items === null ? "Batches are not available on this server yet." : "No batches defined."));
      return;
    }
    items.sort((a, b) => Date.parse(a.next_fire_at || 0) - Date.parse(b.next_fire_at || 0));
    const histories = new Map(await Promise.all(items.filter((b) => opened.has(b.name)).map(async (b) =>
      [b.name, await api(`/api/v1/batches/${encodeURIComponent(b.name)}/firings`, { query: { limit: 10 } })])));
    const toggle = (b) => {
      if (!opened.delete(b.name)) opened.add(b.name);
      refreshBatches();
    };
    clear(batchCard, h("h2", {}, "Batches"),
      h("div", { class: "table-wrap" }, h("table", { id: "batches-table" },
        h("thead", {}, h("tr", {}, h("th", {}, "Batch"), h("th", { class: "hide-sm" }, "Project"), h("th", { class: "hide-sm" }, "Schedule"), h("th", { class: "hide-sm" }, "Runs"), h("th", { class: "hide-sm" }, "Overlap"), h("th", {}, "Next firing"), h("th", {}, ""))),
        h("tbody", {}, items.flatMap((b) => [h("tr", {},
          h("td", {}, h("button", {
            type: "button", class: "link-btn", dataset: { history: b.name }, "aria-expanded": String(opened.has(b.name)),
            title: "Show or hide its recent firings", onclick: () => toggle(b),
          }, `${opened.has(b.name) ? "▾" : "▸"} ${b.name}`)),
          h("td", { class: "hide-sm" }, b.project ?? "—"),
          h("td", { class: "hide-sm" }, h("span", { class: "mono" }, b.cron ?? b.schedule ?? "—"), b.timezone ? ` ${b.timezone}` : ""),
          h("td", { class: "hide-sm" }, b.target === "offpeak" ? `off-peak${b.window ? ` (${b.window})` : ""}` : "at once",
            b.enabled === false ? h("span", { class: "badge" }, " disabled") : ""),
          h("td", { class: "hide-sm", title: OVERLAP_HINT[b.concurrency] || "" }, OVERLAP[b.concurrency] ?? "—"),
          h("td", {}, b.next_fire_at ? `${fmtDateTime(b.next_fire_at)} (${fmtIn(b.next_fire_at)})` : b.enabled === false ? "disabled" : "—"),
          actions(b)),
        histories.has(b.name) ? h("tr", { class: "firings-row" }, h("td", { colspan: 7 }, firingList(b, histories.get(b.name)))) : null])))));
  };
  const stops = [poll(refreshWindows, 60000), poll(refreshBatches, 30000)];
  return () => stops.forEach((s) => s());
}

// A batch's latest firings: when, and what each did (its jobs, or why it submitted none).
function firingList(batch, firings) {
  if (!firings.length) return h("div", { class: "small muted", dataset: { firings: batch.name } }, "No firings yet.");
  const outcome = (f) => f.skipped ? `skipped: ${f.error || "late (catch-up: skip)"}`
    : f.error ? `failed: ${f.error}` : f.run_by ? `run by ${f.run_by}` : "fired";
  return h("table", { class: "firings", dataset: { firings: batch.name } },
    h("thead", {}, h("tr", {}, h("th", {}, "Fired"), h("th", {}, "Jobs"), h("th", {}, "Note"))),
    h("tbody", {}, firings.map((f) => h("tr", {},
      h("td", {}, fmtDateTime(f.fire_at)),
      h("td", {}, f.job_ids.length ? f.job_ids.flatMap((id, i) => [i ? ", " : "", h("a", { href: `#/jobs/${id}` }, `#${id}`)]) : "—"),
      h("td", { class: f.skipped || f.error ? "warn-text" : "" }, outcome(f))))));
}
