// The management API from the page: the token in sessionStorage, errors as problem+json.

const KEY = 'tollgate.token';

export const session = {
  get token() { return sessionStorage.getItem(KEY); },
  set token(value) {
    if (value) sessionStorage.setItem(KEY, value); else sessionStorage.removeItem(KEY);
  },
};

/** A non-2xx answer: `status`, and the problem+json body (`detail`, `field`, ...). */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

/**
 * Calls the API. Answers `{status, data, headers}`; throws ApiError for a status not 2xx (or
 * not in `opts.accept`), and for a network failure (status 0).
 */
export async function api(method, path, body, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  if (session.token && !opts.anonymous) headers.authorization = `Bearer ${session.token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, { detail: `the server did not answer (${e.message})` });
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  const accepted = response.ok || (opts.accept || []).includes(response.status);
  if (!accepted) throw new ApiError(response.status, typeof data === 'object' ? data : { detail: text });
  return { status: response.status, data, headers: response.headers };
}

/** Every page of a list route (`items`, `next`), up to `max` items. */
export async function all(path, max = 1000) {
  const items = [];
  let after = null;
  do {
    const sep = path.includes('?') ? '&' : '?';
    const url = `${path}${sep}limit=200${after ? `&after=${encodeURIComponent(after)}` : ''}`;
    const { data } = await api('GET', url);
    items.push(...data.items);
    after = data.next || null;
  } while (after && items.length < max);
  return items;
}

export const enc = encodeURIComponent;
