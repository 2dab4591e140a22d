// Users (admins): who may submit to which project, and their API tokens, as
// `gpusched admin` does with the database (and sacctmgr with slurmdbd).
import { ApiError, api, hideFieldErrors, showFieldErrors } from "../api.js";
import { cardify, clear, h, poll, toast } from "../util.js";
import { confirmButton } from "./queue.js";

const errorBox = (name) => h("div", { class: "field-error", id: `err-u-${name}`, role: "alert", hidden: true });

export function usersPage(root, ctx) {
  const tokenCard = h("section", { class: "card", id: "new-token", hidden: true });
  const listCard = h("section", { class: "card", id: "users" });
  const errors = { name: errorBox("name"), projects: errorBox("projects"), unix_user: errorBox("unix_user") };
  const general = h("div", { class: "error-box", hidden: true });
  const name = h("input", { id: "u-name", autocomplete: "off", maxlength: 64, required: true });
  const projects = h("input", { id: "u-projects", autocomplete: "off", placeholder: "ml, vision", required: true });
  const admin = h("input", { type: "checkbox", id: "u-admin" });
  // The Unix account the user's jobs run as on the nodes (empty: the user's name).
  const unixUser = h("input", { id: "u-unix_user", autocomplete: "off", maxlength: 64, placeholder: "same as the name" });

  // A token is shown once, as by `gpusched admin create-user`: the server keeps its hash only.
  const showToken = (who, token) => {
    const value = h("input", { id: "token-value", class: "mono", readonly: true, value: token, onfocus: (e) => e.target.select() });
    clear(tokenCard, h("h2", {}, `API token for ${who}`),
      h("p", { class: "small muted" }, "Shown only this once: hand it over now (GPUSCHED_TOKEN, or the dashboard's sign-in)."),
      value,
      h("div", { class: "form-actions" },
        h("button", { type: "button", class: "btn btn-ghost btn-sm", onclick: () => { tokenCard.hidden = true; } }, "Done")));
    tokenCard.hidden = false;
    value.focus();
  };

  const form = h("form", {
    class: "card", id: "user-form", novalidate: true,
    onsubmit: async (ev) => {
      ev.preventDefault();
      hideFieldErrors(errors, general);
      const body = {
        name: name.value.trim(),
        projects: projects.value.split(",").map((p) => p.trim()).filter(Boolean),
        admin: admin.checked,
      };
      if (unixUser.value.trim()) body.unix_user = unixUser.value.trim();
      try {
        const created = await api("/api/v1/users", { method: "POST", body });
        form.reset();
        showToken(created.user.name, created.token);
        await refresh(true);
      } catch (err) {
        showFieldErrors(err, errors, general);
      }
    },
  },
  h("h2", {}, "Add a user"),
  h("div", { class: "form-grid" },
    h("div", { class: "field" }, h("label", { for: "u-name" }, "Name"), name, errors.name),
    h("div", { class: "field" }, h("label", { for: "u-projects" }, "Projects"), projects,
      h("div", { class: "help" }, "comma-separated; a new name creates the project"), errors.projects),
    h("div", { class: "field" }, h("label", { for: "u-unix_user" }, "Unix account"), unixUser,
      h("div", { class: "help" }, "the account the user's jobs run as on the nodes"), errors.unix_user),
    h("label", { class: "check", style: { alignSelf: "center" } }, admin, "Admin")),
  general,
  h("div", { class: "form-actions" }, h("button", { type: "submit", class: "btn btn-primary btn-sm", id: "create-user" }, "Create user")));

  root.append(h("div", { class: "page-head" }, h("h1", {}, "Users")), tokenCard, form, listCard);

  const act = async (what, path, request, done) => {
    try {
      const answer = await api(path, request);
      await refresh(true);
      if (done) done(answer);
    } catch (err) {
      toast(`Cannot ${what}: ${err.message}`, "error");
    }
  };

  // The last admin stays one (the server refuses): no button to demote it.
  const roleButton = (u, admins) => {
    if (u.is_admin && admins === 1) return null;
    const role = u.is_admin ? "a plain user" : "an admin";
    return confirmButton({
      label: u.is_admin ? "Make user" : "Make admin", dataset: { role: u.name }, aria: `Make ${u.name} ${role}`,
      onConfirm: () => act(`make ${u.name} ${role}`, `/api/v1/users/${encodeURIComponent(u.name)}`,
        { method: "PATCH", body: { admin: !u.is_admin } }),
    });
  };

  const row = (u, admins) => {
    const enc = encodeURIComponent(u.name);
    const joinInput = h("input", { class: "inline-input", placeholder: "project", "aria-label": `Add ${u.name} to a project`, dataset: { join: u.name } });
    const join = h("form", {
      class: "inline-form",
      onsubmit: (ev) => {
        ev.preventDefault();
        const project = joinInput.value.trim();
        if (project) act(`add ${u.name} to ${project}`, `/api/v1/users/${enc}/projects/${encodeURIComponent(project)}`, { method: "PUT" });
      },
    }, joinInput, h("button", { type: "submit", class: "btn btn-ghost btn-sm" }, "Add"));
    // The account its jobs run as: changed in place (PATCH), as `gpusched admin set-unix-user`.
    const accountInput = h("input", { class: "inline-input mono", value: u.unix_user, maxlength: 64,
      "aria-label": `Unix account of ${u.name}`, dataset: { unixUser: u.name } });
    const account = h("form", {
      class: "inline-form",
      onsubmit: (ev) => {
        ev.preventDefault();
        const value = accountInput.value.trim();
        if (value && value !== u.unix_user) {
          act(`run ${u.name}'s jobs as ${value}`, `/api/v1/users/${enc}`, { method: "PATCH", body: { unix_user: value } },
            () => toast(`${u.name}'s jobs run as ${value} from now on`));
        }
      },
    }, accountInput, h("button", { type: "submit", class: "btn btn-ghost btn-sm" }, "Set"));
    // A limit of the user's, changed in place (PATCH; empty: `blank`), as
    // `gpusched admin limits USER --max-pending N` (--max-running, --max-gpus).
    const limitForm = (field, key, aria, blank, what, said) => {
      const input = h("input", { class: "inline-input num limit", type: "number", min: 0, step: 1,
        value: u[field] ?? "", placeholder: blank, "aria-label": aria, dataset: { [key]: u.name } });
      return h("form", {
        class: "inline-form",
        onsubmit: (ev) => {
          ev.preventDefault();
          const raw = input.value.trim();
          const limit = raw === "" ? null : Number(raw);
          if (limit !== (u[field] ?? null)) {
            act(`set ${u.name}'s ${what}`, `/api/v1/users/${enc}`, { method: "PATCH", body: { [field]: limit } },
              () => toast(said(limit)));
          }
        },
      }, input, h("button", { type: "submit", class: "btn btn-ghost btn-sm" }, "Set"));
    };
    const pending = limitForm("max_pending_jobs", "maxPending", `Most jobs ${u.name} may have pending`,
      "default", "pending-job limit",
      (n) => n === null ? `${u.name} has the cluster's default limit` : `${u.name} may have ${n} jobs pending`);
    // Running limits (Slurm's MaxJobs, MaxTRES=gres/gpu): over them a job waits; empty: none.
    const running = limitForm("max_running_jobs", "maxRunning", `Most jobs ${u.name} may run at once`,
      "none", "running-job limit",
      (n) => n === null ? `${u.name} may run any number of jobs` : `${u.name} may run ${n} jobs at once`);
    const gpus = limitForm("max_gpus", "maxGpus", `Most GPUs ${u.name}'s running jobs may use`,
      "none", "GPU limit",
      (n) => n === null ? `${u.name} may use any number of GPUs` : `${u.name} may use ${n} GPUs at once`);
    return h("tr", { dataset: { user: u.name } },
      h("td", {}, h("b", {}, u.name)),
      h("td", { class: "role" }, u.is_admin ? h("span", { class: "badge ok" }, "admin") : "user", " ", roleButton(u, admins)),
      h("td", { class: "wide" }, u.projects.map((p) => h("span", { class: "chip", dataset: { project: p } }, p,
        // A user keeps at least one project: the last one has no remove button.
        u.projects.length > 1 ? h("button", {
          type: "button", class: "chip-x", "aria-label": `Remove ${u.name} from ${p}`,
          onclick: () => act(`remove ${u.name} from ${p}`, `/api/v1/users/${enc}/projects/${encodeURIComponent(p)}`, { method: "DELETE" }),
        }, "×") : null)), join),
      h("td", { class: "unix-user" }, account),
      // One column for the three limits, a line each: the row's actions stay in view.
      h("td", { class: "limits" },
        h("div", { class: "limit-line max-pending" }, h("span", { class: "muted" }, "pending"), pending),
        h("div", { class: "limit-line max-running" }, h("span", { class: "muted" }, "running"), running),
        h("div", { class: "limit-line max-gpus" }, h("span", { class: "muted" }, "GPUs"), gpus)),
      h("td", { class: "num" }, String(u.active_tokens)),
      h("td", { class: "actions" },
        h("button", {
          type: "button", class: "btn btn-ghost btn-sm", dataset: { newToken: u.name },
          onclick: () => act(`issue a token for ${u.name}`, `/api/v1/users/${enc}/tokens`, { method: "POST" }, (a) => showToken(u.name, a.token)),
        }, "New token"),
        u.name === ctx.me?.name || !u.active_tokens ? null : confirmButton({
          label: "Revoke", dataset: { revoke: u.name }, aria: `Revoke every token of ${u.name}`, danger: true,
          onConfirm: () => act(`revoke the tokens of ${u.name}`, `/api/v1/users/${enc}/tokens`, { method: "DELETE" },
            (a) => toast(`Revoked ${a.revoked} token(s) of ${u.name}`)),
        })));
  };

  // The 30 s poll does not redraw under an armed button or a field being typed in.
  const refresh = async (force = false) => {
    if (!force && (listCard.querySelector(".armed") || listCard.contains(document.activeElement))) return;
    let users;
    try {
      users = await api("/api/v1/users");
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 403)) throw err;
      form.hidden = true;
      clear(listCard, h("div", { class: "notice", id: "users-denied" }, "Only admins manage users."));
      return;
    }
    clear(listCard, h("h2", {}, "Users and their projects"),
      h("div", { class: "table-wrap" }, cardify(h("table", { id: "users-table" },
        h("thead", {}, h("tr", {}, h("th", {}, "User"), h("th", {}, "Role"), h("th", {}, "Projects"),
          h("th", {}, "Unix account"), h("th", {}, "Limits"),
          h("th", { class: "num" }, "Active tokens"), h("th", {}, ""))),
        h("tbody", {}, users.map((u) => row(u, users.filter((x) => x.is_admin).length)))))));
  };

  return poll(() => refresh(), 30000);
}
