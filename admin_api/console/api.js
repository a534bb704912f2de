// The admin API from the browser: bearer token, JSON in and out, errors as
// {error, detail, field} thrown as ApiError.

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.detail ? body.detail : `HTTP ${status}`;
    const field = body && body.field && !detail.includes(body.field) ? ` (${body.field})` : '';
    super(`${detail}${field}`);
    this.status = status;
    this.body = body || {};
  }
}

export class Api {
  constructor(token) {
    this.token = token;
  }

  async request(method, path, body, headers = {}) {
    const init = { method, headers: { Authorization: `Bearer ${this.token}`, ...headers } };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers['Content-Type'] = 'application/json';
    }
    const response = await fetch(path, init);
    const text = await response.text();
    let parsed = null;
    try { parsed = text ? JSON.parse(text) : null; } catch { parsed = { detail: text }; }
    if (!response.ok) throw new ApiError(response.status, parsed);
    return parsed;
  }

  get(path) { return this.request('GET', path); }
}
