// Talks to the REST API: every request carries the session's bearer token; a 401 sends
// the user back to the login page (app.js listens for "gpusched:unauthorized").

const TOKEN_KEY = "gpusched.token";

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** A failed request. The server answers every error as RFC 9457 problem details: `detail`
 * (the message) and, on a 422, `errors` (each field's `loc` and `msg`). */
export class ApiError extends Error {
  constructor(status, problem) {
    const body = problem !== null && typeof problem === "object" ? problem : { detail: problem };
    const errors = Array.isArray(body.errors) ? body.errors : null;
    super(describe(status, body.detail, errors));
    this.status = status;
    this.detail = typeof body.detail === "string" ? body.detail : null;
    this.errors = errors;
  }
}

/** Hands each message of a 422 to `place(path, message)` (path without "body", e.g.
 * ["schedule", "at"]); returns the messages it did not place (any other error: its own). */
export function placeFieldErrors(err, place) {
  if (!(err instanceof ApiError && err.status === 422 && err.errors)) return [err.message];
  return err.errors.flatMap((item) => {
    const path = (item.loc || []).filter((p) => p !== "body");
    const message = String(item.msg || "invalid").replace(/^Value error, /, "");
    return place(path, message) ? [] : [message];
  });
}

/** Hides a form's error boxes before it is sent again. */
export function hideFieldErrors(boxes, general) {
  Object.values(boxes).forEach((box) => { box.hidden = true; });
  general.hidden = true;
}

/** A form's answer to a failed request: each 422 message under its field's error box in
 * `boxes` (by the field's name), the rest (or any other error) in the `general` box. */
export function showFieldErrors(err, boxes, general) {
  const unplaced = placeFieldErrors(err, ([name], msg) => {
    if (!boxes[name]) return false;
    boxes[name].textContent = msg;
    boxes[name].hidden = false;
    return true;
  });
  general.textContent = unplaced.join("; ");
  general.hidden = !unplaced.length;
}

function describe(status, detail, errors) {
  if (errors && errors.length) return errors.map((d) => d.msg).join("; ");
  if (typeof detail === "string") return detail;
  if (status === 0) return "cannot reach the server";
  return `request failed (HTTP ${status})`;
}

function buildUrl(path, query) {
  const url = new URL(path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value === undefined || value === null || value === "") continue;
    for (const v of Array.isArray(value) ? value : [value]) url.searchParams.append(key, v);
  }
  return url;
}

/** fetch + JSON (or text) + error mapping. `token` overrides the stored one (login check). */
export async function api(path, { method = "GET", body, query, text = false, token, signal } = {}) {
  // Errors come as problem details whatever the route's own type.
  const headers = { Accept: `${text ? "text/plain" : "application/json"}, application/problem+json` };
  const bearer = token ?? getToken();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(buildUrl(path, query), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "cannot reach the server");
  }
  if (!res.ok) {
    let problem = null;
    try {
      problem = await res.json();
    } catch {
      /* not JSON */
    }
    const error = new ApiError(res.status, problem);
    if (res.status === 401 && token === undefined) {
      clearToken();
      window.dispatchEvent(new CustomEvent("gpusched:unauthorized", { detail: error.message }));
    }
    throw error;
  }
  if (res.status === 204) return null;
  return text ? res.text() : res.json();
}

/** Like api(), but an endpoint that does not exist (404) resolves to `fallback`. */
export async function optional(path, options = {}, fallback = null) {
  try {
    return await api(path, options);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return fallback;
    throw err;
  }
}

/** Who the token belongs to: {name, is_admin, projects}; is_admin is null when unknown. */
export async function loadMe(token) {
  const NONE = {}; // a fallback `undefined` would be replaced by optional()'s default
  const me = await optional("/api/v1/me", { token }, NONE);
  if (me !== NONE) return me;
  // No /me on this server: check the token with an endpoint every user may call.
  await api("/api/v1/queues", { token });
  return { name: "", is_admin: null, projects: [] };
}
