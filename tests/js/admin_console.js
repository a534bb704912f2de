#!/usr/bin/env node
// Drives fedgate's admin web console in Debian's headless Chromium with
// playwright-core (no browser download): log in with a token, add a rule
// through the form, try an invalid one, edit the added rule (PUT) and try an
// invalid edit, read the charts of the last hour, take screenshots.
//
//   node admin_console.js --url http://127.0.0.1:8080/ --token T --screenshot out.png
//        [--chromium /usr/bin/chromium] [--rule-name N --rule-match M --edit-match M2]
//        [--filled-queue Q] [--upstream NAME] [--replicated-queue Q]
//
// Waits until the in and out rate charts have a peak above 0 and, with --filled-queue,
// until the queue depths chart has a line for Q. --upstream: the upstream whose page is
// opened (default: the first); --replicated-queue: waits for Q in the replicated queues
// table, with a backup shown, then opens its page.
// Prints one JSON line: {"rules": [names shown], "added": text, "invalid_error": text,
// "edited": text, "edit_error": text, "queues": [names shown],
// "history": {chart: {peak, max, last, samples}}, "depths": [{queue, peak, last}],
// "depths_legend": [text], "connection_page" / "upstream_page":
// {hash, title, fields: {name: text}, headers, rows} | null (the page the first link of
// the connections / upstreams table opens), "replicated": [[cells of each row]],
// "replicated_page": {...} | null, "console_errors": [...], "error": null | "..."}.
'use strict';

const { run, options: parse } = require('./console_browser');

const DEFAULTS = { ruleName: 'ui-deny', ruleMatch: 'ui.secret.#', editMatch: 'ui.hidden.#',
  filledQueue: null, upstream: null, replicatedQueue: null };
const options = (argv) => parse(argv, DEFAULTS, ['url', 'token', 'screenshot']);

async function texts(page, selector) {
  return page.$$eval(selector, (cells) => cells.map((c) => c.textContent.trim()));
}

// Opens the page the first link of ``table`` (or the one reading ``text``) leads to; returns
// its title, fields and rows.
async function detailPage(page, table, screenshot, text) {
  const first = `${table} tbody a`;
  if (!(await page.$(first))) return null;
  if (text) await page.locator(first, { hasText: text }).first().click();
  else await page.click(first);
  await page.waitForSelector('#detail:not([hidden]) #detail-fields td');
  const out = {
    hash: await page.evaluate(() => location.hash),
    title: (await page.textContent('#detail-title')).trim(),
    fields: await page.$$eval('#detail-fields td', (tds) => Object.fromEntries(tds.map((td) => [td.dataset.field, td.textContent.trim()]))),
    rows: await page.$$eval('#detail-rows tbody tr', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent.trim()))),
    headers: await page.$$eval('#detail-rows thead th', (ths) => ths.map((th) => th.textContent.trim())),
  };
  await page.screenshot({ path: screenshot, fullPage: true });
  return out;
}

// Edit ``name`` through its Edit button: the form holds the rule as JSON; ``change`` makes
// the new rule from it. Returns the message shown once the save answered.
async function editRule(page, name, change, expect) {
  await page.locator('#rules tbody tr', { hasText: name }).locator('button', { hasText: 'Edit' }).click();
  await page.waitForSelector('#edit-rule:not([hidden])');
  const rule = JSON.parse(await page.inputValue('#edit-rule textarea[name=json]'));
  await page.fill('#edit-rule textarea[name=json]', JSON.stringify(change(rule), null, 2));
  await page.click('#edit-rule button[type=submit]');
  const where = expect === 'ok' ? '#rule-ok' : '#rule-error';
  const prefix = expect === 'ok' ? `rule ${name} saved` : 'not saved';
  await page.waitForFunction(([selector, text]) => document.querySelector(selector).textContent.startsWith(text),
    [where, prefix]);
  return (await page.textContent(where)).trim();
}

function chartFigures(svg) {
  const number = (text) => (text === '' || text === undefined ? null : Number(text));
  return { peak: number(svg.dataset.peak), max: Number(svg.dataset.max), last: number(svg.dataset.last),
    samples: Number(svg.dataset.samples) };
}

const opts = options(process.argv);
run(opts, async (browser, result) => {
  Object.assign(result, { rules: [], added: null, invalid_error: null, edited: null,
    edit_error: null, queues: [], history: null, depths: [], console_errors: [] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(10000);
  page.on('console', (msg) => { if (msg.type() === 'error') result.console_errors.push(msg.text()); });
  page.on('pageerror', (err) => result.console_errors.push(String(err)));

  await page.goto(opts.url);
  await page.fill('#token', opts.token);
  await page.click('#login button[type=submit]');
  await page.waitForSelector('#status.ok');
  await page.waitForSelector('#nodes tbody td');

  const form = '#add-rule';
  await page.fill(`${form} input[name=name]`, opts.ruleName);
  await page.fill(`${form} input[name=match]`, opts.ruleMatch);
  await page.selectOption(`${form} select[name=kind]`, 'deny');
  await page.click(`${form} button[type=submit]`);
  await page.waitForSelector('#rule-ok:not([hidden])');
  result.added = (await page.textContent('#rule-ok')).trim();
  await page.waitForFunction(
    (name) => [...document.querySelectorAll('#rules tbody td')].some((td) => td.textContent === name),
    opts.ruleName);

  // The server validates: a local rule may not have a primary.
  await page.fill(`${form} input[name=name]`, 'ui-invalid');
  await page.fill(`${form} input[name=match]`, 'ui.invalid');
  await page.selectOption(`${form} select[name=kind]`, 'local');
  await page.fill(`${form} input[name=primary]`, 'n2');
  await page.click(`${form} button[type=submit]`);
  await page.waitForSelector('#rule-error:not([hidden])');
  result.invalid_error = (await page.textContent('#rule-error')).trim();

  // Edit the rule just added (PUT /api/v1/rules/NAME), then an edit the server refuses
  result.edited = await editRule(page, opts.ruleName, (rule) => ({ ...rule, match: opts.editMatch }), 'ok');
  result.edit_form_hidden = await page.isHidden('#edit-rule');
  result.edit_error = await editRule(page, opts.ruleName, (rule) => ({ ...rule, kind: 'proxy' }), 'error');
  await page.click('#edit-cancel');
  await page.waitForFunction(
    ([name, match]) => [...document.querySelectorAll('#rules tbody tr')].some(
      (tr) => tr.children[1].textContent === name && tr.children[2].textContent === match),
    [opts.ruleName, opts.editMatch]);

  result.rules = await texts(page, '#rules tbody td:nth-child(2)');
  result.queues = await texts(page, '#queues tbody td:nth-child(1)');
  // the charts of the last hour: wait until the node's samples show the load (raw
  // figures: data-peak has no floor) and the filled queue has its depth line
  await page.waitForFunction((queue) => {
    const peak = (id) => Number(document.querySelector(id).dataset.peak || 0);
    const lines = [...document.querySelectorAll('#chart-depths polyline')].map((l) => l.dataset.name);
    return peak('#chart-in') > 0 && peak('#chart-out') > 0 && (!queue || lines.includes(queue));
  }, opts.filledQueue, { timeout: 30000 });
  result.history = {};
  for (const name of ['in', 'out', 'connections', 'bytes', 'upstreams', 'depths']) {
    result.history[name] = await page.$eval(`#chart-${name}`, chartFigures);
  }
  result.depths = await page.$$eval('#chart-depths polyline', (lines) => lines.map((l) => ({
    queue: l.dataset.name, peak: Number(l.dataset.peak), last: l.dataset.last === '' ? null : Number(l.dataset.last) })));
  result.depths_legend = await texts(page, '#depths-legend li');
  await page.screenshot({ path: opts.screenshot, fullPage: true });
  await page.locator('#history-section').screenshot({ path: opts.screenshot.replace(/\.png$/, '-charts.png') });

  // a page per connection and per upstream: follow the first link of each table
  result.connection_page = await detailPage(page, '#connections', opts.screenshot.replace(/\.png$/, '-connection.png'));
  await page.click('#detail-back');
  await page.waitForSelector('#detail', { state: 'hidden' });
  result.upstream_page = await detailPage(page, '#upstreams', opts.screenshot.replace(/\.png$/, '-upstream.png'),
    opts.upstream);
  if (opts.replicatedQueue) {  // the replicated queues table, and the queue's page
    await page.click('#detail-back');
    await page.waitForSelector('#detail', { state: 'hidden' });
    await page.waitForFunction((queue) => [...document.querySelectorAll('#replicated tbody tr')].some(
      (tr) => tr.children[0].textContent === queue && tr.children[4].dataset.backups), opts.replicatedQueue);
    result.replicated = await page.$$eval('#replicated tbody tr', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent.trim())));
    await page.locator('#replicated-section').screenshot({ path: opts.screenshot.replace(/\.png$/, '-replicated.png') });
    result.replicated_page = await detailPage(page, '#replicated', opts.screenshot.replace(/\.png$/, '-replicated-queue.png'),
      opts.replicatedQueue);
  }
});
