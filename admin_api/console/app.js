// fedgate web console: plain ES module, no build step. Reads the admin API
// every few seconds; rule changes go to the API, which validates them (the
// error names the field) — the console never checks rules itself.
import { Api } from '/ui/api.js';
import { PEEK_HEADERS, bindQueueActions, queuePage } from '/ui/queues.js';

const REFRESH_MS = 2000;
const $ = (selector) => document.querySelector(selector);
let api = null;
let rulesVersion = null;
let timer = null;
let latest = null;  // the last connections, links and upstreams read (the detail pages)

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = text === null || text === undefined ? '' : String(text);
  if (className) td.className = className;
  return td;
}

function fill(tableId, rows, emptyText) {
  const body = $(`#${tableId} tbody`);
  body.replaceChildren();
  if (!rows.length) {
    const tr = document.createElement('tr');
    const td = cell(emptyText, 'muted');
    td.colSpan = $(`#${tableId} thead tr`).children.length;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const cells of rows) {
    const tr = document.createElement('tr');
    tr.append(...cells);
    body.append(tr);
  }
}

function badge(text, kind) {
  const td = cell('');
  const span = document.createElement('span');
  span.className = `badge ${kind || text}`;
  span.textContent = text;
  td.append(span);
  return td;
}

function showMessage(error, ok) {
  const err = $('#rule-error');
  const good = $('#rule-ok');
  err.hidden = !error;
  err.textContent = error || '';
  good.hidden = !ok;
  good.textContent = ok || '';
}

async function refresh() {
  if (!api) return;
  try {
    const [node, cluster, rules, queues, fragments, upstreams, history, connections, links] = await Promise.all([
      api.get('/api/v1/node'), api.get('/api/v1/cluster'), api.get('/api/v1/rules'),
      api.get('/api/v1/queues'), api.get('/api/v1/fragments'), api.get('/api/v1/upstreams'),
      api.get('/api/v1/history'), api.get('/api/v1/connections'), api.get('/api/v1/links'),
    ]);
    latest = { connections, links, upstreams, queues };
    $('#status').textContent = `connected — refreshed ${new Date().toLocaleTimeString()}`;
    $('#status').className = 'ok';
    renderNode(node, cluster);
    renderRules(rules);
    renderQueues(queues);
    renderFragments(fragments);
    renderReplicated(queues);
    renderUpstreams(upstreams);
    renderConnections(connections);
    renderHistory(history);
    renderDetail();
  } catch (error) {
    $('#status').textContent = `error: ${error.message}`;
    $('#status').className = 'error';
    if (error.status === 401) stop();
  }
}

function renderNode(node, cluster) {
  $('#node-id').textContent = `node ${node.id}`;
  $('#version').textContent = node.version ? `v${node.version}` : '';
  const counters = $('#counters');
  counters.replaceChildren();
  for (const [name, value] of Object.entries(node.counters)) {
    const div = document.createElement('div');
    div.className = 'counter';
    const number = document.createElement('strong');
    number.textContent = value;
    const label = document.createElement('span');
    label.textContent = name.replaceAll('_', ' ');
    div.append(number, label);
    counters.append(div);
  }
  fill('nodes', cluster.nodes.map((n) => [
    cell(n.self ? `${n.id} (this node)` : n.id),
    cell(n.version),
    cell(n.digest ? n.digest.slice(0, 12) : '', 'mono'),
    n.reachable
      ? badge(cluster.divergent.includes(n.id) ? 'behind' : 'in sync', cluster.divergent.includes(n.id) ? 'warn' : 'good')
      : badge('unreachable', 'bad'),
  ]), 'no nodes');
  const notes = [];
  if (cluster.rejected) notes.push(`rejected version ${cluster.rejected.version} from ${cluster.rejected.from}: ${cluster.rejected.detail}`);
  $('#cluster-note').textContent = notes.join(' ');
  renderCluster(node, cluster);
}

// Where the cluster's state lives (static, or etcd: healthy? this node acting or fenced?)
// and its live members, as `fedgate status` prints them.
function renderCluster(node, cluster) {
  const c = cluster.coordinator || { kind: 'static' };
  const line = $('#coordinator');
  line.replaceChildren();
  const tag = (text, kind) => {
    const span = document.createElement('span');
    span.className = `badge ${kind}`;
    span.textContent = text;
    return span;
  };
  if (c.kind !== 'etcd') {
    line.append('static ([peers]; no etcd)');
  } else {
    const lease = c.lease || {};
    line.append(`etcd cluster ${c.name} at ${c.endpoint || (c.endpoints || []).join(', ')}, revision ${c.revision} `,
      c.healthy ? tag('healthy', 'good') : tag('unreachable', 'bad'), ' ',
      c.acting ? tag('acting', 'good') : tag('fenced', 'bad'));
    const details = [];
    if (lease.ttl) details.push(`lease ttl ${lease.ttl} s, renewed ${lease.renewed_s_ago} s ago`);
    if (!c.healthy && c.last_error) details.push(`${c.last_error} (reconnecting, attempt ${c.reconnects})`);
    if (c.error) details.push(c.error);
    if (details.length) line.append(` ${details.join('; ')}`);
  }
  fill('members', (cluster.members || []).map((m) => [
    cell(m.id === node.id ? `${m.id} (this node)` : m.id),
    cell(m.amqp, 'mono'),
    cell(m.admin || '', 'mono'),
    cell(m.workers),
    cell(m.lease_age_s === null || m.lease_age_s === undefined ? '-' : `${m.lease_age_s.toFixed(1)} s`),
    m.draining ? badge('draining', 'warn') : badge('live', 'good'),
  ]), 'no members');
}

// Line charts into an <svg>. Each series is a polyline with data-peak (its largest value,
// as sampled: no floor) and data-last; the <svg> carries data-peak / data-last of the
// first series, data-max (the scale's top: at least 1, so an idle chart is flat) and
// data-samples. The console's browser test reads these attributes.
const SVG = 'http://www.w3.org/2000/svg';
const PALETTE = ['#4c72b0', '#dd8452', '#55a868', '#c44e52', '#8172b3'];

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  return element;
}

function plotted(values) {
  const points = values.map((v, i) => [i, v]).filter(([, v]) => v !== null && v !== undefined);
  return { points, peak: points.length ? Math.max(...points.map(([, v]) => v)) : null,
    last: points.length ? points[points.length - 1][1] : null };
}

function drawLines(id, series, samples) {
  const svg = $(id);
  const lines = series.map((s) => ({ ...s, ...plotted(s.values) }));
  const max = Math.max(1, ...lines.map((l) => l.peak || 0));
  const span = Math.max(1, samples - 1);
  const x = (i) => (i / span) * 300;
  const y = (v) => 76 - (v / max) * 70;
  const children = [];
  lines.forEach((l, k) => {
    const color = PALETTE[k % PALETTE.length];
    const line = svgElement('polyline', { points: l.points.map(([i, v]) => `${x(i)},${y(v)}`).join(' '),
      class: 'series', stroke: color });
    line.dataset.name = l.name || '';
    line.dataset.peak = l.peak === null ? '' : String(l.peak);
    line.dataset.last = l.last === null ? '' : String(l.last);
    children.push(line);
    if (l.points.length) {  // the latest value, seen even alone
      const [i, v] = l.points[l.points.length - 1];
      children.push(svgElement('circle', { cx: x(i), cy: y(v), r: 2.5, class: 'series-dot', fill: color }));
    }
  });
  const first = lines[0] || { peak: null, last: null };
  const label = svgElement('text', { x: 2, y: 10, class: 'chart-label' });
  label.textContent = first.peak === null ? 'no data yet'
    : `peak ${first.peak.toLocaleString()}${first.last === null ? '' : `, now ${first.last.toLocaleString()}`}`;
  children.push(label);
  svg.replaceChildren(...children);
  svg.dataset.peak = first.peak === null ? '' : String(first.peak);
  svg.dataset.last = first.last === null ? '' : String(first.last);
  svg.dataset.max = String(lines.some((l) => l.points.length) ? max : 0);
  svg.dataset.samples = String(samples);
  return lines;
}

function chart(id, values) {
  drawLines(id, [{ name: '', values }], values.length);
}

// The deepest queues of the hour (by their peak depth), one line each, with a legend.
const DEPTH_LINES = 5;

function depthChart(samples) {
  const peaks = new Map();
  for (const s of samples) {
    for (const [name, depth] of Object.entries(s.depths || {})) peaks.set(name, Math.max(peaks.get(name) || 0, depth));
  }
  const names = [...peaks.entries()].filter(([, peak]) => peak > 0)
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).slice(0, DEPTH_LINES).map(([name]) => name);
  const lines = drawLines('#chart-depths', names.map((name) => ({
    name, values: samples.map((s) => (s.depths && name in s.depths ? s.depths[name] : null)),
  })), samples.length);
  const legend = $('#depths-legend');
  legend.replaceChildren(...lines.map((l, k) => {
    const item = document.createElement('li');
    item.dataset.queue = l.name;
    const swatch = document.createElement('span');
    swatch.className = 'swatch';
    swatch.style.background = PALETTE[k % PALETTE.length];
    item.append(swatch, `${l.name} (peak ${l.peak === null ? '-' : l.peak.toLocaleString()})`);
    return item;
  }));
  if (!lines.length) legend.append(Object.assign(document.createElement('li'), { className: 'muted', textContent: 'no messages queued in the last hour' }));
}

function renderHistory(doc) {
  const samples = doc.samples;
  chart('#chart-in', samples.map((s) => s.messages_in_per_s));
  chart('#chart-out', samples.map((s) => s.messages_out_per_s));
  chart('#chart-connections', samples.map((s) => s.connections));
  chart('#chart-bytes', samples.map((s) => s.queued_bytes));
  chart('#chart-upstreams', samples.map((s) => s.upstreams_up));
  depthChart(samples);
}

function target(rule) {
  if (rule.kind === 'proxy') return `${rule.primary} ${rule.remote || ''}`.trim();
  if (rule.kind === 'fragmented') return (rule.fragments || []).map((f) => (typeof f === 'string' ? f : f.peer || f.url)).join(', ');
  return '';
}

function renderRules(doc) {
  rulesVersion = doc.version;
  $('#rules-version').textContent = `version ${doc.version} (${doc.source})`;
  fill('rules', doc.rules.map((rule, index) => {
    const actions = cell('');
    const edit = document.createElement('button');
    edit.textContent = 'Edit';
    edit.className = 'small secondary';
    edit.addEventListener('click', () => startEdit(rule));
    const remove = document.createElement('button');
    remove.textContent = 'Delete';
    remove.className = 'small danger';
    remove.addEventListener('click', () => deleteRule(rule.name));
    actions.append(edit, remove);
    return [cell(index), cell(rule.name, 'mono'), cell(rule.match, 'mono'), badge(rule.kind),
      cell(target(rule), 'mono'), cell(rule.on_change || 'keep'), actions];
  }), 'no rules: every address is a local queue');
}

function renderQueues(doc) {
  // replicated queues held on another node (this one a backup, or proxying) have no local figures
  fill('queues', doc.queues.filter((q) => q.stats).map((q) => [
    link(q.name, `#queue/${encodeURIComponent(q.name)}`), cell(q.depth, 'num'), cell(q.scheduled || 0, 'num'), cell(q.consumers, 'num'),
    cell(q.producers, 'num'), cell(q.unacked, 'num'), cell(q.paged_messages || 0, 'num'),
    cell(q.stats.enqueued, 'num'),
    cell(q.stats.delivered, 'num'), cell(q.stats.dead_lettered, 'num'),
  ]), 'no queues yet');
}

function renderFragments(doc) {
  fill('fragments', doc.fragments.map((f) => [
    cell(f.address, 'mono'), cell(f.local || '(none here)'), cell(f.depth, 'num'), cell(f.stolen_in, 'num'),
  ]), 'no fragments on this node');
}

// Replicated queues this node knows (as primary, backup or proxy): a page each (#replicated/NAME).
const ROLE_BADGES = { primary: 'good', ready: 'good', 'catching-up': 'warn', lagging: 'bad', proxy: 'muted' };

function renderReplicated(doc) {
  fill('replicated', doc.queues.filter((q) => q.replication).map((q) => {
    const r = q.replication;
    const backups = r.backups || [];
    const primary = r.role === 'primary';
    const td = cell('');
    td.dataset.backups = backups.map((b) => `${b.node}:${b.state}`).join(',');
    for (const b of backups) {
      const span = document.createElement('span');
      span.className = `badge ${ROLE_BADGES[b.state] || ''}`;
      span.textContent = `${b.node} ${b.state}`;
      td.append(span, ' ');
    }
    if (!primary) td.textContent = r.copy ? `(this node's copy: ${r.copy.depth} messages)` : '';
    return [
      link(q.name, `#replicated/${encodeURIComponent(q.name)}`),
      badge(r.role, ROLE_BADGES[r.role] || ''),
      cell(r.primary || (r.placement && r.placement.length ? `${r.placement[0]} (preferred; none known yet)` : '')),
      cell(r.epoch, 'num'),
      td,
      cell(primary ? `${(r.in_sync || []).length} / ${backups.length}` : ''),
      cell(primary ? r.lag_messages : '', 'num'),
      cell(primary ? r.lag_ms : '', 'num'),
      cell(r.failovers, 'num'),
    ];
  }), 'no replicated queues known to this node');
}

function link(text, hash) {
  const td = cell('');
  const a = document.createElement('a');
  a.href = hash;
  a.textContent = text;
  td.append(a);
  return td;
}

const upstreamKey = (u) => (u.worker === undefined ? '' : `${u.worker}:`) + (u.name || u.primary);

function renderUpstreams(doc) {
  fill('upstreams', doc.upstreams.map((u) => [
    link(u.name || u.primary, `#upstream/${encodeURIComponent(upstreamKey(u))}`),
    cell((u.members || []).length, 'num'),
    badge(u.state || 'unknown', ['up', 'open', 'connected'].includes(u.state) ? 'good' : 'bad'),
    cell(u.reconnects, 'num'),
  ]), 'no upstreams');
}

function renderConnections(doc) {
  fill('connections', doc.connections.map((c) => [
    link(String(c.id), `#connection/${c.id}`), cell(c.peer, 'mono'),
    cell(c.transport + (c.tls ? ' + TLS' : '')), cell(c.user || '(anonymous)'),
    cell(c.links, 'num'), cell(c.sent, 'num'), cell(c.received, 'num'),
  ]), 'no client connections');
}

// -- a page per connection and per upstream (#connection/ID, #upstream/KEY) -----------
function showDetail(title, fields, rowsTitle, headers, rows, emptyText) {
  $('#detail').hidden = false;
  $('#detail-title').textContent = title;
  const body = $('#detail-fields tbody');
  body.replaceChildren(...fields.map(([name, value]) => {
    const tr = document.createElement('tr');
    const th = document.createElement('th');
    th.textContent = name;
    const td = cell(value);
    td.dataset.field = name;
    tr.append(th, td);
    return tr;
  }));
  $('#detail-rows-title').textContent = rowsTitle;
  $('#detail-rows thead tr').replaceChildren(...headers.map((h) => {
    const th = document.createElement('th');
    th.textContent = h;
    return th;
  }));
  fill('detail-rows', rows, emptyText);
}

function renderDetail() {
  const [kind, key] = decodeURIComponent(location.hash.slice(1)).split(/\/(.*)/s);
  const sections = document.querySelectorAll('main > section:not(#detail)');
  $('#queue-actions').hidden = kind !== 'queue' || !key;
  if (!latest || !key || !['connection', 'upstream', 'replicated', 'queue'].includes(kind)) {
    $('#detail').hidden = true;
    sections.forEach((s) => { s.hidden = false; });
    return;
  }
  sections.forEach((s) => { s.hidden = true; });
  if (kind === 'queue') {
    queuePage(api, key, cell).then(([fields, rows]) => {
      showDetail(`queue ${key}`, fields, `first messages (none taken)`, PEEK_HEADERS, rows, 'no messages waiting');
    }).catch((error) => showDetail(`queue ${key}`, [['state', error.message]], '', [], [], ''));
    return;
  }
  if (kind === 'connection') {
    const c = latest.connections.connections.find((x) => String(x.id) === key);
    if (!c) {
      showDetail(`connection ${key}`, [['state', 'closed (or not on this node)']], '', [], [], '');
      return;
    }
    const links = latest.links.links.filter((l) => String(l.connection) === key);
    showDetail(`connection ${c.id}`, [
      ['peer', c.peer], ['transport', c.transport + (c.tls ? ' + TLS' : '')],
      ['user', c.user || '(anonymous)'], ['mechanism', c.mechanism || ''],
      ['worker', c.worker === undefined ? '' : c.worker], ['links', c.links],
      ['sent', c.sent], ['received', c.received],
    ], 'links', ['name', 'address', 'role', 'credit', 'unsettled', 'sent', 'received'],
    links.map((l) => [cell(l.name, 'mono'), cell(l.address, 'mono'), cell(l.role),
      cell(l.credit, 'num'), cell(l.unsettled, 'num'), cell(l.sent, 'num'), cell(l.received, 'num')]),
    'no links');
    return;
  }
  if (kind === 'replicated') {
    const q = latest.queues.queues.find((x) => x.replication && x.name === key);
    if (!q) {
      showDetail(`replicated queue ${key}`, [['role', 'not known to this node']], '', [], [], '');
      return;
    }
    const r = q.replication;
    const copy = r.copy || {};
    showDetail(`replicated queue ${q.name}`, [
      ['this node', r.role], ['primary', r.primary || `none known yet (preferred: ${(r.placement || [])[0] || ''})`],
      ['epoch', r.epoch === null ? '' : r.epoch], ['replicas', r.replicas],
      ['replica set', (r.placement || []).join(', ')], ['failovers', r.failovers],
      ['depth', r.role === 'primary' ? r.depth : (r.copy ? copy.depth : '')],
      ['in sync', r.role === 'primary' ? (r.in_sync || []).join(', ') || 'none' : (r.copy ? String(copy.in_sync) : '')],
      ['waiting acceptance', r.waiting_acceptance === undefined ? '' : r.waiting_acceptance],
      ['waiting links', r.waiting_links],
    ], 'backups (on the primary)', ['backup', 'state', 'lag (messages)', 'lag (ms)', 'catch-up left'],
    (r.backups || []).map((b) => [cell(b.node), badge(b.state, ROLE_BADGES[b.state] || ''),
      cell(b.lag_messages, 'num'), cell(b.lag_ms, 'num'), cell(b.catchup_left, 'num')]),
    r.role === 'primary' ? 'no backups attached' : 'shown on the primary');
    return;
  }
  const u = latest.upstreams.upstreams.find((x) => upstreamKey(x) === key);
  if (!u) {
    showDetail(`upstream ${key}`, [['state', 'gone (or not on this node)']], '', [], [], '');
    return;
  }
  const suspects = u.suspects || {};
  showDetail(`upstream ${u.name || u.primary}`, [
    ['primary', u.primary || u.url || ''], ['state', u.state], ['pool size', u.pool_size],
    ['split directions', u.split_directions], ['reconnects', u.reconnects],
    ['sessions ended', (u.members || []).reduce((n, m) => n + (m.sessions_ended || 0), 0)],
    ['rechecks', u.rechecks], ['suspect deliveries waiting', suspects.waiting === undefined ? '' : suspects.waiting],
    ['worker', u.worker === undefined ? '' : u.worker],
  ], 'members (connections)', ['member', 'role', 'state', 'links', 'connects', 'reconnects',
    'sessions ended', 'sent', 'received', 'last error'],
  (u.members || []).map((m) => [cell(m.member, 'num'), cell(m.role),
    // a member never needed (split directions: no sender yet) is idle, not down
    m.state === 'down' && !m.connects ? badge('idle', 'muted')
      : badge(m.state, ['up', 'open', 'connected'].includes(m.state) ? 'good' : 'bad'), cell(m.links, 'num'),
    cell(m.connects, 'num'), cell(m.reconnects, 'num'), cell(m.sessions_ended, 'num'),
    cell(m.sent, 'num'), cell(m.received, 'num'), cell(m.last_error || '', 'mono')]),
  'no members');
}

function ifMatch() {
  return rulesVersion === null ? {} : { 'If-Match': String(rulesVersion) };
}

async function addRule(event) {
  event.preventDefault();
  const form = event.target;
  const data = new FormData(form);
  const rule = { name: data.get('name').trim(), match: data.get('match').trim(), kind: data.get('kind') };
  for (const key of ['primary', 'remote']) {
    const value = data.get(key).trim();
    if (value) rule[key] = value;
  }
  const position = data.get('position').trim();
  const query = position ? `?position=${encodeURIComponent(position)}` : '';
  try {
    const result = await api.request('POST', `/api/v1/rules${query}`, rule, ifMatch());
    showMessage(null, `rule ${result.rule.name} added (version ${result.version})`);
    form.reset();
  } catch (error) {
    showMessage(`not added: ${error.message}`);
  }
  await refresh();
}

function startEdit(rule) {
  const form = $('#edit-rule');
  form.hidden = false;
  form.dataset.name = rule.name;
  $('#edit-name').textContent = rule.name;
  form.elements.json.value = JSON.stringify(rule, null, 2);
  form.elements.json.focus();
}

async function saveEdit(event) {
  event.preventDefault();
  const form = event.target;
  let rule;
  try {
    rule = JSON.parse(form.elements.json.value);
  } catch (error) {
    showMessage(`not JSON: ${error.message}`);
    return;
  }
  try {
    const result = await api.request('PUT', `/api/v1/rules/${encodeURIComponent(form.dataset.name)}`, rule, ifMatch());
    showMessage(null, `rule ${result.rule.name} saved (version ${result.version})`);
    form.hidden = true;
  } catch (error) {
    showMessage(`not saved: ${error.message}`);
  }
  await refresh();
}

async function deleteRule(name) {
  if (!window.confirm(`Delete rule ${name}?`)) return;
  try {
    const result = await api.request('DELETE', `/api/v1/rules/${encodeURIComponent(name)}`, undefined, ifMatch());
    showMessage(null, `rule ${name} deleted (version ${result.version})`);
  } catch (error) {
    showMessage(`not deleted: ${error.message}`);
  }
  await refresh();
}

async function resolveAddress(event) {
  event.preventDefault();
  const address = new FormData(event.target).get('address');
  try {
    const result = await api.get(`/api/v1/resolve?address=${encodeURIComponent(address)}`);
    $('#resolve-result').textContent = `${result.decision}: ${result.reason}`;
  } catch (error) {
    $('#resolve-result').textContent = error.message;
  }
}

function stop() {
  if (timer) clearInterval(timer);
  timer = null;
}

function connect(token) {
  api = new Api(token);
  sessionStorage.setItem('fedgate-token', token);
  stop();
  refresh();
  timer = setInterval(refresh, REFRESH_MS);
}

$('#login').addEventListener('submit', (event) => {
  event.preventDefault();
  connect($('#token').value.trim());
});
$('#add-rule').addEventListener('submit', addRule);
$('#edit-rule').addEventListener('submit', saveEdit);
$('#edit-cancel').addEventListener('click', () => { $('#edit-rule').hidden = true; });
$('#resolve').addEventListener('submit', resolveAddress);
window.addEventListener('hashchange', renderDetail);
bindQueueActions(() => api, () => {
  const [kind, key] = decodeURIComponent(location.hash.slice(1)).split(/\/(.*)/s);
  return kind === 'queue' ? key : null;
}, refresh);

const saved = sessionStorage.getItem('fedgate-token');
if (saved) {
  $('#token').value = saved;
  connect(saved);
}
