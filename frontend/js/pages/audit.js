// Audit trail (admins): who changed which quota, membership, token, drain or window.
import { ApiError, api } from "../api.js";
import { cardify, clear, fmtAgo, fmtDateSec, h, poll } from "../util.js";

const LIMIT = 100;

// As `gpusched audit` prints it: {"gpu_quota": {"from": 0, "to": 4}} -> "gpu_quota 0 -> 4",
// settings as "key=value", nested ones in parentheses, unset ones left out.
const isSet = ([, v]) => v !== null && v !== undefined;

function plain(value) {
  if (value === null || value === undefined) return "-";
  if (Array.isArray(value)) return value.map(plain).join(",") || "-";
  if (typeof value === "object") {
    return `(${Object.entries(value).filter(isSet).map(([k, v]) => `${k}=${plain(v)}`).join(" ")})`;
  }
  return String(value);
}

function changeText(info) {
  return Object.entries(info).filter(isSet)
    .map(([k, v]) => (v && typeof v === "object" && "from" in v && "to" in v
      ? `${k} ${plain(v.from)} -> ${plain(v.to)}`
      : `${k}=${plain(v)}`))
    .join(", ");
}

export function auditPage(root) {
  const card = h("section", { class: "card", id: "audit" });
  root.append(h("div", { class: "page-head" }, h("h1", {}, "Audit trail")), card);

  const refresh = async () => {
    let page;
    try {
      page = await api("/api/v1/audit", { query: { limit: LIMIT } });
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 403)) throw err;
      clear(card, h("div", { class: "notice", id: "audit-denied" }, "Only admins see the audit trail."));
      return;
    }
    if (!page.items.length) {
      clear(card, h("h2", {}, "Administrative changes"),
        h("div", { class: "notice", id: "no-audit" }, "No administrative changes recorded yet."));
      return;
    }
    clear(card,
      h("div", { class: "card-head" }, h("h2", {}, "Administrative changes"),
        h("span", { class: "small muted" }, page.next_before ? `newest ${LIMIT}; older: gpusched audit --before ${page.next_before}` : "newest first")),
      h("div", { class: "table-wrap" }, cardify(h("table", { id: "audit-table" },
        h("thead", {}, h("tr", {}, h("th", {}, "When"), h("th", {}, "Who"), h("th", {}, "Action"), h("th", {}, "Target"), h("th", {}, "Change"))),
        h("tbody", {}, page.items.map((e) => h("tr", { "data-audit": e.id },
          h("td", { title: fmtAgo(e.at) }, fmtDateSec(e.at)),
          h("td", {}, e.actor),
          h("td", { class: "mono" }, e.action),
          h("td", {}, e.target),
          h("td", { class: "small change wide" }, changeText(e.info)))))))));
  };

  return poll(refresh, 30000);
}
