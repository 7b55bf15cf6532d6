// The admin API, called with the key the user gave once (sessionStorage: gone when the tab
// closes; never in a URL or a cookie).

const KEY_NAME = "reef.adminKey";
// The gateway's root, from the page's own address (/ui/ → /), so a path prefix added by
// a reverse proxy is kept.
const ROOT = new URL("..", document.baseURI);

/** No key, or the key was refused (401): the page asks for one. */
export class AuthRequired extends Error {}

/** The key is valid but may not read the admin API (403). */
export class Forbidden extends Error {}

/** Any other failed call, with its HTTP status. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

let keysRequired = null;

export function storedKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function storeKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
}

async function needsKey() {
  if (keysRequired === null) {
    const response = await fetch("auth.json", { cache: "no-store" });
    keysRequired = response.ok ? Boolean((await response.json()).keys_required) : false;
  }
  return keysRequired;
}

async function message(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || response.statusText;
  } catch {
    return response.statusText || `HTTP ${response.status}`;
  }
}

async function call(method, path, query) {
  const key = storedKey();
  if (!key && (await needsKey())) throw new AuthRequired("This gateway needs an admin key.");
  const url = new URL(path, ROOT);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  const headers = { accept: "application/json" };
  if (key) headers.authorization = `Bearer ${key}`;
  let response;
  try {
    response = await fetch(url, { method, headers, cache: "no-store" });
  } catch (error) {
    throw new ApiError(0, `the gateway did not answer (${error.message})`);
  }
  if (response.status === 401) {
    forgetKey();
    throw new AuthRequired(`The key was refused: ${await message(response)}`);
  }
  if (response.status === 403) throw new Forbidden(await message(response));
  if (!response.ok) throw new ApiError(response.status, await message(response));
  return response.json();
}

/** GET a path of the admin API ("reef/scenarios"); the parsed JSON, or throws one of
 * AuthRequired, Forbidden, ApiError. */
export function get(path, query) {
  return call("GET", path, query);
}

/** POST to an admin action that takes no body ("reef/feedback/{id}/release"), with the
 * same key and errors as get(). The key travels in a header, never a cookie, so another
 * site cannot make the browser send it (no CSRF). */
export function post(path) {
  return call("POST", path, null);
}

/** DELETE an admin resource ("reef/scenarios/{s}"), with the same key and errors as get(). */
export function remove(path) {
  return call("DELETE", path, null);
}

/** GET that answers null for a 404 (a harness or release that does not exist). */
export async function getOrNull(path, query) {
  try {
    return await get(path, query);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return null;
    throw error;
  }
}
