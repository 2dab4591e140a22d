// Audit trail (admins): who changed which quota, membership, token, drain or window.
import { ApiError, api } from "../api.js";
import { cardify, clear, fmtAgo, fmtDateTime, h, poll } from "../util.js";

const LIMIT = 100;

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
          h("td", { title: fmtAgo(e.at) }, fmtDateTime(e.at)),
          h("td", {}, e.actor),
          h("td", { class: "mono" }, e.action),
          h("td", {}, e.target),
          // The server's one-line summary: the CLI prints the same.
          h("td", { class: "small change wide" }, e.summary))))))));
  };

  return poll(refresh, 30000);
}
