// The page of one queue (#queue/NAME): its first messages, read without taking them
// (GET /api/v1/queues/NAME/messages), and the operations: move (to, count, selector),
// purge, resend dead-lettered messages, delete (force). Each answer, or the API's refusal
// with its reason, is shown in #queue-result; the page is read again after each.

const PEEK = 20;
const gone = new Set();  // queues deleted from their page (not asked for again while it is shown)
const $ = (selector) => document.querySelector(selector);
const path = (name, action) => `/api/v1/queues/${encodeURIComponent(name)}${action ? `/${action}` : ''}`;

function say(text, ok) {
  const line = $('#queue-result');
  line.textContent = text;
  line.className = ok ? 'ok' : 'error';
}

// [fields, rows] of the queue's page; rows are the first messages.
export async function queuePage(api, name, cell) {
  if (gone.has(name)) return [[['state', 'deleted']], []];
  const doc = await api.get(`${path(name, 'messages')}?count=${PEEK}`);
  const fields = [['node', doc.node], ['kind', doc.scope], ['depth', doc.depth],
    ['scheduled', doc.scheduled], ['unacked', doc.unacked]];
  const rows = doc.messages.map((m) => {
    const p = m.properties || {};
    return [cell(p.message_id, 'mono'), cell(p.subject || ''), cell(m.delivery_count, 'num'),
      cell(m.size, 'num'), cell(JSON.stringify(m.application_properties || {}), 'mono'),
      cell((m.annotations || {})['x-opt-dead-letter-address'] || ''), cell(m.body, 'mono')];
  });
  return [fields, rows];
}

export const PEEK_HEADERS = ['message id', 'subject', 'delivery count', 'size',
  'application properties', 'dead-lettered from', 'body (start)'];

// The buttons and the move form act on the queue ``current()`` names; ``after()`` redraws.
export function bindQueueActions(getApi, current, after) {
  window.addEventListener('hashchange', () => { gone.clear(); $('#queue-result').textContent = ''; });
  async function act(method, action, body, describe) {
    const name = current();
    if (!name) return;
    try {
      const result = await getApi().request(method, action === null ? path(name) + ($('#queue-force').checked ? '?force=true' : '') : path(name, action), body);
      say(describe(result), true);
      if (method === 'DELETE') gone.add(name);
    } catch (error) {
      say(`refused: ${error.message}`, false);
    }
    await after();
  }
  const failures = (r) => (r.failures || []).map((f) => ` ${f.count} not taken by ${f.to}: ${f.reason} (back in the queue)`).join(';');
  $('#queue-move').addEventListener('submit', (event) => {
    event.preventDefault();
    const form = new FormData(event.target);
    const body = { to: form.get('to') };
    if (form.get('count')) body.count = Number(form.get('count'));
    if (form.get('selector')) body.selector = form.get('selector');
    act('POST', 'move', body, (r) => `${r.moved} of ${r.selected} messages moved to ${r.to}.${failures(r)}`);
  });
  $('#queue-purge').addEventListener('click', () => {
    if (!window.confirm(`Purge queue ${current()}?`)) return;
    act('POST', 'purge', undefined, (r) => `${r.purged} messages purged`);
  });
  $('#queue-resend').addEventListener('click', () => act('POST', 'resend', {},
    (r) => `${r.resent} of ${r.selected} dead-lettered messages resent.${failures(r)}`));
  $('#queue-delete').addEventListener('click', () => {
    if (!window.confirm(`Delete queue ${current()}?`)) return;
    act('DELETE', null, undefined, (r) => `queue ${r.name} deleted (${r.purged} messages purged, ${r.links_closed} links closed)`);
  });
}
