import { ApiError, loadMe, setToken } from "../api.js";
import { h } from "../util.js";

export function loginPage(root, ctx, done) {
  const message = ctx.loginMessage;
  ctx.loginMessage = "";
  const error = h("div", { class: "error-box", id: "login-error", role: "alert", hidden: !message }, message);
  const input = h("input", {
    id: "token", name: "token", type: "password", autocomplete: "off", required: true,
    placeholder: "gps_…", spellcheck: "false",
  });
  const button = h("button", { class: "btn btn-primary", type: "submit", style: { width: "100%" } }, "Sign in");
  const form = h("form", {
    onsubmit: async (ev) => {
      ev.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      button.disabled = true;
      error.hidden = true;
      try {
        ctx.me = await loadMe(token);
        setToken(token);
        done();
      } catch (err) {
        error.textContent = err instanceof ApiError && err.status === 401
          ? "That token is not valid (unknown, expired or revoked)."
          : `Cannot sign in: ${err.message}`;
        error.hidden = false;
        button.disabled = false;
        input.focus();
      }
    },
  },
  error,
  h("div", { class: "field" },
    h("label", { for: "token" }, "API token"),
    input,
    h("div", { class: "help" }, "Kept in this browser tab only (sessionStorage). Create one with ",
      h("code", {}, "gpusched admin create-token NAME"), ".")),
  button);
  root.append(h("div", { class: "login" },
    h("div", { class: "card" },
      h("h1", { class: "login-brand" }, h("img", { src: "favicon.svg", alt: "", width: 28, height: 28 }), "gpusched"),
      h("p", {}, "GPU cluster scheduler. Sign in with your API token."),
      form)));
  input.focus();
}
