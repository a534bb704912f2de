#!/usr/bin/env node
// Opens a page in Debian's headless Chromium (playwright-core, no browser download)
// and waits for it to set window.fedgateResult; used for AMQP over WebSocket from a
// real browser (tests/js/browser/amqp_ws.html).
//
//   node browser_ws.js --url http://127.0.0.1:PORT/amqp_ws.html?ws=... --screenshot out.png
//        [--chromium /usr/bin/chromium] [--timeout-ms 30000]
//
// Prints one JSON line: {"result": <the page's result> | null, "console_errors": [...], "error": null | "..."}.
'use strict';

const { chromium } = require('playwright-core');

const LAUNCH_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

function options(argv) {
  const out = { chromium: '/usr/bin/chromium', timeoutMs: '30000' };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    out[key] = argv[i + 1];
  }
  for (const required of ['url', 'screenshot']) {
    if (!out[required]) {
      process.stderr.write(`missing --${required}\n`);
      process.exit(64);
    }
  }
  return out;
}

async function main() {
  const opts = options(process.argv);
  const out = { result: null, console_errors: [], error: null };
  const browser = await chromium.launch({ executablePath: opts.chromium, args: LAUNCH_ARGS, timeout: 30000 });
  try {
    const page = await browser.newPage({ viewport: { width: 1000, height: 600 } });
    page.on('console', (msg) => { if (msg.type() === 'error') out.console_errors.push(msg.text()); });
    page.on('pageerror', (err) => out.console_errors.push(String(err)));
    await page.goto(opts.url);
    try {
      await page.waitForFunction(() => window.fedgateResult !== undefined, null,
                                 { timeout: Number(opts.timeoutMs) });
    } catch (err) {
      out.error = `the page set no result: ${err.message.split('\n')[0]}`;
    }
    out.result = await page.evaluate(() => window.fedgateResult || null);
    await page.screenshot({ path: opts.screenshot });
  } catch (err) {
    out.error = String(err && err.message || err);
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main();
