// The dashboard shell: hash routes, login state and the signed-in user.
import { ApiError, clearToken, getToken, loadMe } from "./api.js";
import { clear, h } from "./util.js";
import { loginPage } from "./pages/login.js";
import { overviewPage } from "./pages/overview.js";
import { queuePage } from "./pages/queue.js";
import { nodesPage } from "./pages/nodes.js";
import { jobPage } from "./pages/job.js";
import { windowsPage } from "./pages/windows.js";
import { submitPage } from "./pages/submit.js";
import { auditPage } from "./pages/audit.js";
import { usersPage } from "./pages/users.js";

const root = document.getElementById("app");
const topbar = document.getElementById("topbar");

// ctx.me: {name, is_admin, projects} from GET /api/v1/me; is_admin is null when the
// server has no /me (then admin buttons are shown and a 403 explains itself).
const ctx = { me: null, loginMessage: "" };
let unmount = null;

const routes = [
  [/^\/?$/, "overview", overviewPage],
  [/^\/queue$/, "queue", queuePage],
  [/^\/nodes$/, "nodes", nodesPage],
  [/^\/windows$/, "windows", windowsPage],
  [/^\/submit$/, "submit", submitPage],
  [/^\/audit$/, "audit", auditPage],
  [/^\/users$/, "users", usersPage],
  [/^\/jobs\/(\d+)$/, "queue", jobPage],
];

function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/";
  const [path, qs] = raw.split("?");
  return { path, params: new URLSearchParams(qs || "") };
}

async function render() {
  if (unmount) {
    try { unmount(); } catch (err) { console.warn(err); }
    unmount = null;
  }
  const { path, params } = parseHash();
  if (!getToken()) {
    topbar.hidden = true;
    document.title = "Sign in · gpusched";
    unmount = loginPage(root, ctx, () => {
      // Stay on the page that was asked for; a hash change renders it by itself.
      const target = window.location.hash || "#/";
      if (window.location.hash !== target) window.location.hash = target;
      else render();
    });
    return;
  }
  if (!ctx.me) {
    try {
      ctx.me = await loadMe();
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) {
        clear(root, h("div", { class: "error-box" }, `Cannot load the dashboard: ${err.message}`));
        topbar.hidden = true;
      }
      return;
    }
  }
  topbar.hidden = false;
  document.getElementById("who-name").textContent = ctx.me.name
    ? `${ctx.me.name}${ctx.me.is_admin ? " · admin" : ""}`
    : "";
  // The audit trail and users are for admins (unknown role: shown, and a 403 explains itself).
  for (const nav of ["audit", "users"]) {
    document.querySelector(`[data-nav=${nav}]`).hidden = ctx.me.is_admin === false;
  }
  for (const [re, nav, page] of routes) {
    const match = path.match(re);
    if (!match) continue;
    for (const a of document.querySelectorAll("[data-nav]")) {
      a.classList.toggle("active", a.dataset.nav === nav);
      if (a.dataset.nav === nav) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    clear(root);
    unmount = page(root, ctx, { match, params }) || null;
    return;
  }
  clear(root, h("div", { class: "card" }, h("h1", {}, "Page not found"),
    h("p", {}, h("a", { href: "#/" }, "Back to the overview"))));
}

window.addEventListener("hashchange", render);
window.addEventListener("gpusched:unauthorized", (ev) => {
  ctx.me = null;
  const message = `Signed out: ${ev.detail}. Sign in again with a valid token.`;
  // Several polls may fail at once: render the login page once, keep what is typed there.
  if (root.querySelector("#token")) return;
  ctx.loginMessage = message;
  render();
});
document.getElementById("logout").addEventListener("click", () => {
  clearToken();
  ctx.me = null;
  ctx.loginMessage = "You are signed out.";
  window.location.hash = "#/";
  render();
});

render();
