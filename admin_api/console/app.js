// fedgate web console: plain ES module, no build step. Reads the admin API
// every few seconds; rule changes go to the API, which validates them (the
// error names the field) — the console never checks rules itself.
import { Api } from '/ui/api.js';

const REFRESH_MS = 2000;
const $ = (selector) => document.querySelector(selector);
let api = null;
let rulesVersion = null;
let timer = null;

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
    const [node, cluster, rules, queues, fragments, upstreams, history] = await Promise.all([
      api.get('/api/v1/node'), api.get('/api/v1/cluster'), api.get('/api/v1/rules'),
      api.get('/api/v1/queues'), api.get('/api/v1/fragments'), api.get('/api/v1/upstreams'),
      api.get('/api/v1/history'),
    ]);
    $('#status').textContent = `connected — refreshed ${new Date().toLocaleTimeString()}`;
    $('#status').className = 'ok';
    renderNode(node, cluster);
    renderRules(rules);
    renderQueues(queues);
    renderFragments(fragments);
    renderUpstreams(upstreams);
    renderHistory(history);
  } catch (error) {
    $('#status').textContent = `error: ${error.message}`;
    $('#status').className = 'error';
    if (error.status === 401) stop();
  }
}

function renderNode(node, cluster) {
  $('#node-id').textContent = `node ${node.id}`;
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
}

// A line chart of one series into an <svg>: the polyline, the largest value as a label,
// and data-last / data-max attributes (read by the console's browser test).
function chart(id, values) {
  const svg = $(id);
  const points = values.map((v, i) => [i, v]).filter(([, v]) => v !== null && v !== undefined);
  const max = Math.max(1, ...points.map(([, v]) => v));
  const span = Math.max(1, values.length - 1);
  const ns = 'http://www.w3.org/2000/svg';
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', points.map(([i, v]) => `${(i / span) * 300},${76 - (v / max) * 70}`).join(' '));
  line.setAttribute('class', 'series');
  const label = document.createElementNS(ns, 'text');
  label.setAttribute('x', '2');
  label.setAttribute('y', '10');
  label.setAttribute('class', 'chart-label');
  const last = points.length ? points[points.length - 1][1] : null;
  label.textContent = `max ${max.toLocaleString()}${last === null ? '' : `, now ${last.toLocaleString()}`}`;
  const dot = document.createElementNS(ns, 'circle');  // the latest value, seen even alone
  if (points.length) {
    const [i, v] = points[points.length - 1];
    dot.setAttribute('cx', String((i / span) * 300));
    dot.setAttribute('cy', String(76 - (v / max) * 70));
    dot.setAttribute('r', '2.5');
    dot.setAttribute('class', 'series-dot');
  }
  svg.replaceChildren(line, dot, label);
  svg.dataset.max = String(points.length ? max : 0);
  svg.dataset.last = last === null ? '' : String(last);
  svg.dataset.samples = String(values.length);
}

function renderHistory(doc) {
  const samples = doc.samples;
  chart('#chart-in', samples.map((s) => s.messages_in_per_s));
  chart('#chart-out', samples.map((s) => s.messages_out_per_s));
  chart('#chart-connections', samples.map((s) => s.connections));
  chart('#chart-bytes', samples.map((s) => s.queued_bytes));
  chart('#chart-upstreams', samples.map((s) => s.upstreams_up));
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
  fill('queues', doc.queues.map((q) => [
    cell(q.name, 'mono'), cell(q.depth, 'num'), cell(q.consumers, 'num'), cell(q.producers, 'num'),
    cell(q.unacked, 'num'), cell(q.stats.enqueued, 'num'), cell(q.stats.delivered, 'num'),
  ]), 'no queues yet');
}

function renderFragments(doc) {
  fill('fragments', doc.fragments.map((f) => [
    cell(f.queue || f.name, 'mono'), cell(f.fragment || f.node), cell(f.depth, 'num'), cell(f.steals, 'num'),
  ]), 'no fragments on this node');
}

function renderUpstreams(doc) {
  fill('upstreams', doc.upstreams.map((u) => [
    cell(u.name || u.id), cell(u.url || u.primary, 'mono'),
    badge(u.state || 'unknown', ['up', 'open', 'connected'].includes(u.state) ? 'good' : 'bad'),
    cell(u.reconnects, 'num'),
  ]), 'no upstreams');
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

const saved = sessionStorage.getItem('fedgate-token');
if (saved) {
  $('#token').value = saved;
  connect(saved);
}
