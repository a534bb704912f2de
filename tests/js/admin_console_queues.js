#!/usr/bin/env node
// Drives the console's queue page (#queue/NAME) in Debian's headless Chromium with
// playwright-core: log in, read the version in the header, open the queue from the queues
// table, read its first messages, move those a selector selects, purge, resend, delete.
//
//   node admin_console_queues.js --url http://127.0.0.1:8080/ --token T --queue Q
//        --move-to ADDRESS --selector "color = 'red'" --screenshot out.png [--chromium PATH]
//
// Prints one JSON line: {"version": text, "hash", "title", "fields": {name: text},
// "headers", "rows" (before), "moved": text, "rows_after_move", "purged": text,
// "resent": text, "refused": text (delete without force), "deleted": text,
// "console_errors": [...], "error": null | "..."}.
'use strict';

const { run, options } = require('./console_browser');

const rowsOf = (page) => page.$$eval('#detail-rows tbody tr', (trs) => trs.map((tr) => [...tr.children].map((td) => td.textContent.trim())));

// Clicks (or submits) and waits for a new text in #queue-result.
async function act(page, click) {
  const before = (await page.textContent('#queue-result')).trim();
  await click();
  await page.waitForFunction((old) => {
    const text = document.querySelector('#queue-result').textContent.trim();
    return text && text !== old;
  }, before);
  return (await page.textContent('#queue-result')).trim();
}

const opts = options(process.argv);
run(opts, async (browser, result) => {
  result.console_errors = [];
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(10000);
  page.on('console', (msg) => { if (msg.type() === 'error') result.console_errors.push(msg.text()); });
  page.on('pageerror', (err) => result.console_errors.push(String(err)));
  page.on('dialog', (dialog) => dialog.accept());  // the confirm() of purge and delete

  await page.goto(opts.url);
  await page.fill('#token', opts.token);
  await page.click('#login button[type=submit]');
  await page.waitForSelector('#status.ok');
  await page.waitForFunction(() => document.querySelector('#version').textContent !== '');
  result.version = (await page.textContent('#version')).trim();

  await page.locator('#queues tbody a', { hasText: opts.queue }).first().click();
  await page.waitForSelector('#detail:not([hidden]) #detail-rows tbody td:not(.muted)');
  result.hash = await page.evaluate(() => location.hash);
  result.title = (await page.textContent('#detail-title')).trim();
  result.fields = await page.$$eval('#detail-fields td', (tds) => Object.fromEntries(tds.map((td) => [td.dataset.field, td.textContent.trim()])));
  result.headers = await page.$$eval('#detail-rows thead th', (ths) => ths.map((th) => th.textContent.trim()));
  result.rows = await rowsOf(page);
  await page.screenshot({ path: opts.screenshot, fullPage: true });

  await page.fill('#queue-move input[name=to]', opts.moveTo);
  await page.fill('#queue-move input[name=selector]', opts.selector);
  result.moved = await act(page, () => page.click('#queue-move button[type=submit]'));
  await page.waitForFunction((n) => document.querySelectorAll('#detail-rows tbody tr').length === n,
    result.rows.length - Number(result.moved.split(' ')[0]));
  result.rows_after_move = await rowsOf(page);
  result.refused = await act(page, () => page.click('#queue-delete'));
  result.purged = await act(page, () => page.click('#queue-purge'));
  result.resent = await act(page, () => page.click('#queue-resend'));
  await page.check('#queue-force');
  result.deleted = await act(page, () => page.click('#queue-delete'));
});
