// Submit form: POST /api/v1/jobs; the server's 422 messages are shown next to their fields.
import { api, ApiError, placeFieldErrors } from "../api.js";
import { clear, fmtMem, h } from "../util.js";

// How the jobs named in depends_on must have ended (sbatch --dependency kinds).
export const DEPENDENCY_KINDS = [
  ["afterok", "succeeded"], ["afterany", "ended in any way"], ["afternotok", "failed"], ["after", "started"],
];

// When a job with a notify URL is announced (sbatch --mail-type).
const NOTIFY_ON = [["end", "ends, however"], ["fail", "fails"], ["start,end", "starts and ends"],
  ["end,requeue", "ends or is requeued (preempted, …)"]];

// The estimator's choices (POST /api/v1/estimate, a job's "model").
const PRECISIONS = [["mixed", "mixed (fp16/bf16)"], ["bf16", "bf16"], ["fp32", "fp32"]];
const OPTIMIZERS = [["adam", "Adam / AdamW"], ["adam8bit", "8-bit Adam"], ["adafactor", "Adafactor"], ["sgd", "SGD (momentum)"]];
const SHARDINGS = [["none", "none"], ["zero1", "ZeRO-1 (optimizer)"], ["zero2", "ZeRO-2 (+ gradients)"], ["zero3", "ZeRO-3 (+ weights)"]];
const SCALE = { "": 1, k: 1e3, m: 1e6, b: 1e9, t: 1e12 };

/** "7B", "350M", "1.3b", "7e9" or "7000000000" -> a parameter count; throws on anything else. */
export function parseParameters(text) {
  const raw = text.trim().replace(/[_,]/g, "");
  const short = raw.match(/^(\d+(?:\.\d+)?)\s*([kmbt]?)$/i);
  const count = short ? Number(short[1]) * SCALE[short[2].toLowerCase()] : /^\d+(\.\d+)?e\d+$/i.test(raw) ? Number(raw) : NaN;
  if (!Number.isFinite(count) || count < 1) throw new Error(`"${text.trim()}" is not a parameter count: write 7B, 350M or 7000000000`);
  return Math.round(count);
}

const INT_FIELDS = ["gpus", "gpu_memory_mb", "nodes", "priority", "max_runtime_s", "estimated_runtime_s", "grace_s", "retries"];

function field(name, label, input, { help, span = "" } = {}) {
  input.id = input.id || `f-${name}`;
  input.name = name;
  return h("div", { class: `field ${span}`, dataset: { field: name } },
    h("label", { for: input.id }, label),
    input,
    help ? h("div", { class: "help", id: `help-${name}` }, help) : null,
    h("div", { class: "field-error", id: `err-${name}`, role: "alert", hidden: true }));
}

/** The form field a 422's location points at: nested ones have fields of their own. */
const fieldOf = (name, sub) => {
  if (name === "schedule" && sub === "at") return "at";
  if (name === "model") return sub ? `model_${sub}` : "model";
  if (name === "array" && sub === "max_running") return "max_running";
  return name;
};

const num = (attrs) => h("input", { type: "number", inputmode: "numeric", ...attrs });

/** "KEY=value" lines -> object; throws {line, message} on the first bad line. */
export function parsePairs(text) {
  const out = {};
  text.split("\n").forEach((raw, i) => {
    const line = raw.trim();
    if (!line || line.startsWith("#")) return;
    const eq = line.indexOf("=");
    if (eq <= 0) throw new Error(`line ${i + 1}: expected key=value, got "${line}"`);
    out[line.slice(0, eq).trim()] = line.slice(eq + 1);
  });
  return out;
}

export function submitPage(root, ctx) {
  const defaultUrl = ctx.me?.notify_url || "";
  const notifyBox = h("input", { type: "checkbox", id: "f-notify", name: "notify" });
  const projects = ctx.me?.projects || [];
  const projectInput = projects.length > 1 || ctx.me?.is_admin === false
    ? h("select", {}, projects.map((p) => h("option", { value: p }, p)))
    : h("input", { type: "text", placeholder: projects[0] || "default", list: "project-list" });
  const atInput = h("input", { type: "datetime-local", id: "f-at", disabled: true });
  const modeRadios = ["now", "offpeak", "at"].map((mode) => h("label", {},
    h("input", { type: "radio", name: "mode", value: mode, checked: mode === "now", id: `f-mode-${mode}`,
      onchange: () => {
        atInput.disabled = mode !== "at";
        form.querySelector("[data-field=at]").hidden = mode !== "at";
        if (mode === "at") atInput.focus();
      } }),
    { now: "As soon as possible", offpeak: "Next off-peak window", at: "At a time" }[mode]));
  const general = h("div", { class: "error-box", id: "form-error", role: "alert", hidden: true });
  const success = h("div", { class: "ok-box", id: "form-success", role: "status", hidden: true });
  const submit = h("button", { type: "submit", class: "btn btn-primary", id: "submit-job" }, "Submit job");

  const form = h("form", { id: "submit-form", novalidate: true, onsubmit: (ev) => { ev.preventDefault(); send(); } },
    h("fieldset", {}, h("legend", {}, "What to run"),
      h("div", { class: "form-grid" },
        field("name", "Name", h("input", { type: "text", maxlength: 200, placeholder: "e.g. resnet50-sweep-3" }), { span: "span-2" }),
        field("project", "Project", projectInput, { help: projects.length ? null : "Leave empty for your default project" }),
        field("priority", "Priority", num({ value: 0, min: -1000, max: 1000 }), { help: "-1000 … 1000, higher runs first" }),
        field("command", "Command", h("textarea", { rows: 3, placeholder: "python train.py --epochs 10", required: true }),
          { span: "span-4", help: "Run by /bin/sh -c on the node" }),
        field("workdir", "Working directory", h("input", { type: "text", placeholder: "/home/you/project", spellcheck: "false" }),
          { span: "span-2", help: "absolute path on the node where the command starts; empty: a temporary directory" }),
        field("array", "Array", h("input", { type: "text", placeholder: "e.g. 0-9 or 1,3,5-7" }),
          { help: "one job per index, in $GPUSCHED_ARRAY_TASK_ID (sbatch --array)" }),
        field("max_running", "Tasks at once", num({ min: 1, placeholder: "no limit" }), { help: "array only (%N)" }))),
    h("fieldset", {}, h("legend", {}, "Resources"),
      h("div", { class: "form-grid" },
        field("gpus", "GPUs per node", num({ value: 1, min: 0 })),
        field("nodes", "Nodes", num({ value: 1, min: 1 })),
        field("gpu_memory_mb", "GPU memory (MiB)", num({ min: 1, placeholder: "any" })),
        field("gpu_share", "GPU share", h("input", { type: "number", step: "0.05", min: 0.05, max: 1, placeholder: "1 (whole GPU)" }),
          { help: "below 1 shares one GPU" }),
        field("gpu_model", "GPU model", h("input", { type: "text", placeholder: "any", list: "model-list" })),
        field("only_nodes", "Only on nodes", h("input", { type: "text", placeholder: "any node" }),
          { span: "span-2", help: "any of these, comma-separated" }),
        field("exclude_nodes", "Exclude nodes", h("input", { type: "text", placeholder: "none" }),
          { span: "span-2", help: "never on these (sbatch --exclude)" }),
        field("max_runtime_s", "Max runtime (s)", num({ min: 1, placeholder: "no limit" })),
        field("estimated_runtime_s", "Estimated runtime (s)", num({ min: 1, placeholder: "unknown" }), { help: "helps backfill" }),
        field("retries", "Retries", num({ value: 0, min: 0, max: 100 })),
        field("grace_s", "Grace to checkpoint (s)", num({ min: 0, placeholder: "node default" }),
          { help: "SIGTERM to SIGKILL when stopped; $GPUSCHED_GRACE_S" }),
        h("div", { class: "field span-4", dataset: { field: "preemptible" } },
          h("label", { class: "check" }, h("input", { type: "checkbox", id: "f-preemptible", name: "preemptible" }),
            "Preemptible: may be stopped and requeued for higher-priority work"),
          h("div", { class: "field-error", id: "err-preemptible", hidden: true })))),
    h("fieldset", { id: "model-fields" }, h("legend", {}, "Model (for the memory estimate)"),
      h("p", { class: "small muted fieldset-note" },
        "Describe what it trains instead of giving GPU memory: the job then asks for the estimated memory per GPU, "
        + "and a model that fits no GPU of the cluster is refused with the changes that would make it fit."),
      h("div", { class: "form-grid" },
        field("model_parameters", "Parameters", h("input", { type: "text", placeholder: "e.g. 7B or 350M", spellcheck: "false" }),
          { help: "count of the model's weights" }),
        field("model_precision", "Precision", h("select", {}, PRECISIONS.map(([v, l]) => h("option", { value: v }, l)))),
        field("model_optimizer", "Optimizer", h("select", {}, OPTIMIZERS.map(([v, l]) => h("option", { value: v }, l)))),
        field("model_sharding", "Sharding", h("select", {}, SHARDINGS.map(([v, l]) => h("option", { value: v }, l))),
          { help: "ZeRO across the job's GPUs" }),
        field("model_micro_batch", "Micro-batch", num({ min: 1, placeholder: "1" }), { help: "sequences per GPU per step" }),
        field("model_seq_len", "Sequence length", num({ min: 1, placeholder: "2048" })),
        h("div", { class: "field span-2", dataset: { field: "model_checkpointing" } },
          h("label", { class: "check" }, h("input", { type: "checkbox", id: "f-model_checkpointing", name: "model_checkpointing" }),
            "Activation checkpointing (recompute activations: less memory, slower)"),
          h("div", { class: "field-error", id: "err-model_checkpointing", hidden: true })),
        h("div", { class: "field span-4" },
          h("div", { class: "form-actions" },
            h("button", { type: "button", class: "btn btn-sm", id: "estimate-model", onclick: () => estimateModel() }, "Estimate memory"),
            h("span", { class: "small muted" }, "for the GPUs and GPU model above")),
          h("div", { class: "estimate-result", id: "model-estimate", role: "status", hidden: true }),
          h("div", { class: "field-error", id: "err-model", role: "alert", hidden: true })))),
    h("fieldset", {}, h("legend", {}, "When"),
      h("div", { class: "form-grid" },
        h("div", { class: "field span-2", dataset: { field: "schedule" } },
          h("label", {}, "Start"), h("div", { class: "radios", role: "radiogroup" }, modeRadios),
          h("div", { class: "field-error", id: "err-schedule", hidden: true })),
        field("at", "Start time (your local time)", atInput, { span: "span-2" }),
        field("depends_on", "After jobs", h("input", { type: "text", inputmode: "numeric", placeholder: "e.g. 12, 13" }),
          { help: "it starts once they have…" }),
        field("dependency", "…ended how", h("select", {},
          DEPENDENCY_KINDS.map(([value, label]) => h("option", { value }, label))),
          { help: "if they cannot any more, it is cancelled" }),
        h("div", { class: "field span-2", dataset: { field: "singleton" } },
          h("label", { class: "check" }, h("input", { type: "checkbox", id: "f-singleton", name: "singleton" }),
            "One at a time: wait while another job of mine with this name runs (singleton)"),
          h("div", { class: "field-error", id: "err-singleton", hidden: true })),
        h("div", { class: "field span-2", dataset: { field: "hold" } },
          h("label", { class: "check" }, h("input", { type: "checkbox", id: "f-hold", name: "hold" }),
            "Submit held: it starts once released"),
          h("div", { class: "field-error", id: "err-hold", hidden: true })))),
    h("fieldset", {}, h("legend", {}, "Environment and labels"),
      h("div", { class: "form-grid" },
        field("env", "Environment", h("textarea", { rows: 3, placeholder: "KEY=value, one per line" }), { span: "span-2" }),
        field("labels", "Labels", h("textarea", { rows: 3, placeholder: "team=vision, one per line" }), { span: "span-2" }),
        h("div", { class: "field span-2", dataset: { field: "notify" } },
          h("label", { class: "check" }, notifyBox, "Notify me by webhook (as sbatch --mail-type)")),
        field("notify_url", "Notify URL", h("input", {
          type: "url",
          placeholder: defaultUrl ? `empty: your default, ${defaultUrl}` : "https://chat.example.com/hooks/…",
          // Typing a URL asks for messages.
          oninput: (e) => { if (e.target.value.trim()) notifyBox.checked = true; },
        }), {
          span: "span-2",
          help: defaultUrl ? "a JSON message is POSTed here, or to your default (gpusched me --notify)"
            : "a JSON message is POSTed here (its text suits chat webhooks); gpusched me --notify sets a default",
        }),
        field("notify_on", "…when it", h("select", {}, NOTIFY_ON.map(([value, label]) => h("option", { value }, label))),
          { span: "span-2" }))),
    general,
    success,
    h("div", { class: "form-actions" }, submit, h("a", { class: "btn btn-ghost", href: "#/queue" }, "Back to queue")),
    h("datalist", { id: "project-list" }, projects.map((p) => h("option", { value: p }))),
    h("datalist", { id: "model-list" }));

  root.append(h("div", { class: "page-head" }, h("h1", {}, "Submit a job")), form);
  form.querySelector("[data-field=at]").hidden = true;
  // Suggestions: the projects this user can see and the GPU models the cluster has.
  const fill = (id, values) => {
    const list = form.querySelector(`#${id}`);
    const have = new Set([...list.options].map((o) => o.value));
    for (const v of values) if (!have.has(v)) { have.add(v); list.append(h("option", { value: v })); }
  };
  api("/api/v1/queues").then((qs) => fill("project-list", qs.map((q) => q.project))).catch(() => {});
  api("/api/v1/nodes").then((nodes) => {
    fill("model-list", nodes.flatMap((n) => n.gpus.map((g) => g.model)));
    const names = nodes.map((n) => n.name).join(", ");
    if (names) form.querySelector("#help-only_nodes").textContent = `any of these, comma-separated; nodes: ${names}`;
  }).catch(() => {});

  const input = (name) => form.querySelector(`#f-${name}`);
  const showError = (name, message) => {
    const box = form.querySelector(`#err-${name}`);
    if (!box) return false;
    box.textContent = box.hidden ? message : `${box.textContent}; ${message}`;
    box.hidden = false;
    const el = input(name);
    if (el) el.setAttribute("aria-invalid", "true");
    return true;
  };
  const resetErrors = () => {
    for (const box of form.querySelectorAll(".field-error")) { box.hidden = true; box.textContent = ""; }
    for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
    general.hidden = true;
    success.hidden = true;
  };

  /** The job's "model" from the Model fields, or null when no parameter count is given. */
  const collectModel = (errors) => {
    const text = (name) => input(name).value.trim();
    if (!text("model_parameters")) {
      const other = ["model_micro_batch", "model_seq_len"].some((n) => text(n)) || input("model_checkpointing").checked;
      if (other) errors.push(["model_parameters", "give the parameter count to estimate the memory"]);
      return null;
    }
    const model = {};
    try {
      model.parameters = parseParameters(text("model_parameters"));
    } catch (err) {
      errors.push(["model_parameters", err.message]);
      return null;
    }
    for (const name of ["precision", "optimizer", "sharding"]) model[name] = input(`model_${name}`).value;
    for (const name of ["micro_batch", "seq_len"]) if (text(`model_${name}`)) model[name] = Number(text(`model_${name}`));
    if (input("model_checkpointing").checked) model.checkpointing = true;
    return model;
  };

  // What the job would ask for: the estimate for its GPUs (gpus x nodes), judged against
  // its GPU model or the cluster's, as a submission would be.
  const estimateBox = form.querySelector("#model-estimate");
  async function estimateModel() {
    resetErrors();
    const errors = [];
    const model = collectModel(errors);
    if (!model && !errors.length) errors.push(["model_parameters", "give the parameter count to estimate the memory"]);
    if (errors.length) { errors.forEach(([name, msg]) => showError(name, msg)); return; }
    const gpus = Number(input("gpus").value || 1) * Number(input("nodes").value || 1);
    const body = { ...model, gpu_count: Math.max(1, gpus) };
    if (input("gpu_model").value.trim()) body.gpu_model = input("gpu_model").value.trim();
    try {
      const result = await api("/api/v1/estimate", { method: "POST", body });
      const fits = Object.values(result.fits || {});
      clear(estimateBox,
        h("b", {}, `About ${fmtMem(result.per_gpu_mib)} per GPU`), ` on ${result.gpu_count} GPU${result.gpu_count === 1 ? "" : "s"}`,
        h("ul", { class: "plain" }, fits.map((fit) => h("li", { class: fit.fits_as_requested ? "" : "warn-text" }, fit.message))),
        (result.suggestions || []).length ? h("div", {}, "To fit: ", result.suggestions.slice(0, 3).map((x) => x.description).join("; ")) : null);
      estimateBox.hidden = false;
    } catch (err) {
      if (err instanceof ApiError && err.status === 422) {
        const unplaced = placeFieldErrors(err, ([name], msg) => typeof name === "string" && showError(`model_${name}`, msg));
        if (unplaced.length) showError("model", unplaced.join("; "));
      } else if (err.status !== 401) {
        showError("model", err.message);
      }
    }
  }

  const collect = () => {
    const body = {};
    const errors = [];
    const text = (name) => input(name).value.trim();
    if (text("name")) body.name = text("name");
    body.command = input("command").value;
    if (text("project")) body.project = text("project");
    if (text("gpu_model")) body.gpu_model = text("gpu_model");
    if (text("workdir")) body.workdir = text("workdir");
    const model = collectModel(errors);
    if (model) body.model = model;
    const names = (name) => text(name).split(",").map((n) => n.trim()).filter(Boolean);
    if (names("only_nodes").length) body.only_nodes = names("only_nodes");
    if (names("exclude_nodes").length) body.exclude_nodes = names("exclude_nodes");
    if (notifyBox.checked || text("notify_url")) {
      if (text("notify_url")) body.notify_url = text("notify_url");  // else the user's default
      body.notify_on = input("notify_on").value.split(",");
    }
    for (const name of INT_FIELDS) {
      const raw = text(name);
      if (raw === "") {
        if (input(name).validity.badInput) errors.push([name, "not a number"]);
        continue;
      }
      body[name] = Number(raw);
    }
    if (text("gpu_share")) body.gpu_share = Number(text("gpu_share"));
    body.preemptible = input("preemptible").checked;
    const mode = form.querySelector("input[name=mode]:checked").value;
    body.schedule = { mode };
    if (mode === "at") {
      if (!atInput.value) errors.push(["at", "choose a start time"]);
      else body.schedule.at = new Date(atInput.value).toISOString();
    }
    const after = text("depends_on").split(/[\s,]+/).filter(Boolean);
    const notId = after.find((id) => !/^[1-9]\d*$/.test(id));
    if (notId) errors.push(["depends_on", `"${notId}" is not a job id`]);
    else body.depends_on = after.map(Number);
    if (after.length) body.dependency = input("dependency").value;
    if (input("singleton").checked) body.dependency = "singleton";
    if (text("array")) {
      body.array = { indices: text("array") };
      if (text("max_running")) body.array.max_running = Number(text("max_running"));
    } else if (text("max_running")) {
      errors.push(["max_running", "only for an array: give its indices too"]);
    }
    body.hold = input("hold").checked;
    for (const name of ["env", "labels"]) {
      try {
        body[name] = parsePairs(input(name).value);
      } catch (err) {
        errors.push([name, err.message]);
      }
    }
    return { body, errors };
  };

  async function send() {
    resetErrors();
    const { body, errors } = collect();
    if (errors.length) {
      errors.forEach(([name, msg]) => showError(name, msg));
      form.querySelector("[aria-invalid=true]")?.focus();
      return;
    }
    submit.disabled = true;
    try {
      const job = await api("/api/v1/jobs", { method: "POST", body });
      clear(success, job.array
        ? `Array #${job.array.id} submitted: ${job.array.tasks} jobs (${job.status.toLowerCase()}). `
        : `Job #${job.id} submitted (${job.status.toLowerCase()}). `,
      h("a", { href: `#/jobs/${job.id}`, id: "job-link" }, job.array ? "View its first task →" : "View the job →"));
      success.hidden = false;
    } catch (err) {
      if (err instanceof ApiError && err.status === 422 && err.errors) {
        const unplaced = placeFieldErrors(err, ([name, sub], msg) =>
          typeof name === "string" && showError(fieldOf(name, sub), msg));
        if (unplaced.length) {
          general.textContent = unplaced.join("; ");
          general.hidden = false;
        }
        form.querySelector("[aria-invalid=true]")?.focus();
      } else if (err.status !== 401) {
        general.textContent = err.message;
        general.hidden = false;
      }
    } finally {
      submit.disabled = false;
    }
  }
}
