// What the console's browser drivers share: Debian's headless Chromium through
// playwright-core (no browser download), and their `--flag value` options.
'use strict';

const { chromium } = require('playwright-core');

const LAUNCH_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

// `--some-flag value` pairs as {someFlag: value} over `defaults`; exits 64 naming the first
// of `required` that is missing.
function options(argv, defaults = {}, required = []) {
  const out = { chromium: '/usr/bin/chromium', ...defaults };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    out[key] = argv[i + 1];
  }
  for (const name of required) {
    if (!out[name]) {
      process.stderr.write(`missing --${name}\n`);
      process.exit(64);
    }
  }
  return out;
}

function launch(opts) {
  return chromium.launch({ executablePath: opts.chromium, args: LAUNCH_ARGS, timeout: 30000 });
}

// Runs `drive(browser, result)`, then prints `result` as one JSON line (with `error` set if
// anything threw) and exits 2 on an error, 0 otherwise.
function run(opts, drive) {
  (async () => {
    const result = { error: null };
    const browser = await launch(opts);
    try {
      await drive(browser, result);
    } catch (err) {
      result.error = String(err && err.stack ? err.stack : err);
    } finally {
      await browser.close();
    }
    process.stdout.write(JSON.stringify(result) + '\n');
    process.exit(result.error ? 2 : 0);
  })().catch((err) => {
    process.stdout.write(JSON.stringify({ error: String(err) }) + '\n');
    process.exit(2);
  });
}

module.exports = { options, launch, run };
