'use strict';
// Shared helpers for the rhea command-line clients (send.js, receive.js).
// See README.md in this directory for the CLI and output contract.

const { parseArgs } = require('node:util');

const EXIT_OK = 0;
const EXIT_AMQP_ERROR = 2;
const EXIT_TIMEOUT = 3;
const EXIT_USAGE = 64;

const COMMON_OPTIONS = {
    url: { type: 'string' },
    address: { type: 'string' },
    count: { type: 'string' },
    username: { type: 'string' },
    password: { type: 'string' },
    sasl: { type: 'string', default: 'auto' },
    hostname: { type: 'string' },
    'timeout-ms': { type: 'string', default: '30000' },
    'tls-insecure': { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
};

function usageError(usage, message) {
    process.stderr.write(`error: ${message}\n${usage}\n`);
    process.exit(EXIT_USAGE);
}

function parseCli(usage, extraOptions) {
    let parsed;
    try {
        parsed = parseArgs({
            args: process.argv.slice(2),
            options: Object.assign({}, COMMON_OPTIONS, extraOptions),
            strict: true,
            allowPositionals: false,
        });
    } catch (e) {
        usageError(usage, e.message);
    }
    const v = parsed.values;
    if (v.help) {
        process.stdout.write(usage + '\n');
        process.exit(EXIT_OK);
    }
    return v;
}

function parseIntOption(usage, values, name, { min = 0, required = false, fallback } = {}) {
    const raw = values[name];
    if (raw === undefined) {
        if (required) usageError(usage, `--${name} is required`);
        return fallback;
    }
    if (!/^\d+$/.test(raw)) usageError(usage, `--${name} must be a non-negative integer, got ${JSON.stringify(raw)}`);
    const n = Number(raw);
    if (!Number.isSafeInteger(n) || n < min) usageError(usage, `--${name} must be an integer >= ${min}`);
    return n;
}

// Build rhea connection options from --url and the credential/SASL options.
//
// SASL modes (--sasl):
//   auto (default): PLAIN when a username and password are given (via
//        --username/--password or user:pass@ in the URL), otherwise ANONYMOUS.
//   anonymous: always SASL ANONYMOUS (credentials ignored).
//   plain: SASL PLAIN, requires username and password.
//   none: no SASL layer at all; the client starts directly with the AMQP
//        protocol header. This is what rhea itself does when it is given
//        explicit connect options without a username.
function connectOptions(usage, values) {
    if (!values.url) usageError(usage, '--url is required');
    let url;
    try {
        url = new URL(values.url);
    } catch (e) {
        usageError(usage, `invalid --url ${JSON.stringify(values.url)}: ${e.message}`);
    }
    const scheme = url.protocol.replace(/:$/, '');
    if (!['amqp', 'amqps', 'ws', 'wss'].includes(scheme)) usageError(usage, `--url scheme must be amqp, amqps, ws or wss, got ${scheme}`);
    let host = url.hostname;
    if (host.startsWith('[') && host.endsWith(']')) host = host.slice(1, -1); // IPv6 literal
    const port = url.port ? Number(url.port) : ({ amqps: 5671, ws: 80, wss: 443 }[scheme] || 5672);

    const username = values.username !== undefined ? values.username
        : (url.username ? decodeURIComponent(url.username) : undefined);
    const password = values.password !== undefined ? values.password
        : (url.password ? decodeURIComponent(url.password) : undefined);

    const opts = {
        host,
        port,
        // Open frame hostname: like proton, default to the host from the URL
        // (rhea on its own sends no hostname unless told to).
        hostname: values.hostname !== undefined ? values.hostname : host,
        container_id: `fedgate-rhea-${process.pid}`,
        // rhea reconnects (with backoff, forever) by default; the tests need
        // a single attempt whose failure is reported.
        reconnect: false,
        // Report modified outcomes as modified (rhea folds them into
        // 'released' by default).
        treat_modified_as_released: false,
    };
    if (scheme === 'amqps') {
        opts.transport = 'tls';
        opts.servername = host;
        opts.rejectUnauthorized = !values['tls-insecure'];
    }
    if (scheme === 'ws' || scheme === 'wss') {
        // AMQP over WebSocket (the OASIS binding): rhea over the `ws` package,
        // subprotocol "amqp"; the URL's path goes into the upgrade request
        const WebSocket = require('ws');
        const wsUrl = `${scheme}://${url.host}${url.pathname}${url.search}`;
        const wsOptions = scheme === 'wss' ? { rejectUnauthorized: !values['tls-insecure'] } : {};
        opts.connection_details = require('rhea').websocket_connect(WebSocket)(wsUrl, ['amqp'], wsOptions);
    }

    const mode = values.sasl;
    if (mode === 'none') {
        // no username => rhea skips the SASL layer
    } else if (mode === 'anonymous') {
        opts.username = 'anonymous'; // username without password => SASL ANONYMOUS
    } else if (mode === 'plain' || mode === 'auto') {
        if (username !== undefined && password !== undefined) {
            opts.username = username;
            opts.password = password;
        } else if (mode === 'plain') {
            usageError(usage, '--sasl plain needs --username and --password');
        } else {
            opts.username = 'anonymous';
        }
    } else {
        usageError(usage, `--sasl must be one of auto, anonymous, plain, none; got ${JSON.stringify(mode)}`);
    }
    return opts;
}

// Write one JSON line to stdout.
function emit(obj) {
    process.stdout.write(JSON.stringify(obj) + '\n');
}

// Write a final JSON line and exit once stdout has been flushed.
function finish(obj, code) {
    process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code));
    // Belt and braces in case the write callback never fires (closed pipe).
    setTimeout(() => process.exit(code), 2000).unref();
}

// Convert whatever rhea hands us (an AMQP error frame field, a ConnectionError,
// a LinkError, a socket Error) into {condition, description}.
function toErrorInfo(err, fallbackCondition) {
    if (!err) return { condition: fallbackCondition, description: null };
    let condition = err.condition;
    if (condition !== undefined && condition !== null && typeof condition !== 'string') {
        condition = String(condition); // symbols decode to strings, but be safe
    }
    let description = err.description !== undefined ? err.description : err.message;
    if (description === undefined) description = null;
    if (!condition) condition = fallbackCondition;
    return { condition, description: description === null ? null : String(description) };
}

// Wire up the connection/session/link error handlers shared by both clients.
// `onError(info)` is called at most once with {condition, description}.
// `linkPrefix` is 'sender' or 'receiver'. `isClosing()` tells whether we
// initiated the close ourselves (then a close without error is expected).
function installErrorHandlers(container, linkPrefix, onError, isClosing) {
    container.on('connection_error', (ctx) => {
        onError(toErrorInfo(ctx.error || ctx.connection.error, 'connection-error'));
    });
    container.on('connection_close', (ctx) => {
        const err = ctx.connection.error;
        if (err) onError(toErrorInfo(err, 'connection-error'));
        else if (!isClosing()) onError({ condition: 'connection-closed', description: 'peer closed the connection without an error' });
    });
    container.on('session_error', (ctx) => {
        onError(toErrorInfo(ctx.session.error, 'session-error'));
    });
    container.on('session_close', (ctx) => {
        if (ctx.session.error) onError(toErrorInfo(ctx.session.error, 'session-error'));
        else if (!isClosing()) onError({ condition: 'session-closed', description: 'peer ended the session without an error' });
    });
    container.on(`${linkPrefix}_error`, (ctx) => {
        onError(toErrorInfo(ctx[linkPrefix].error, 'link-error'));
    });
    container.on(`${linkPrefix}_close`, (ctx) => {
        const err = ctx[linkPrefix].error;
        if (err) onError(toErrorInfo(err, 'link-error'));
        else if (!isClosing()) onError({ condition: 'link-closed', description: 'peer detached the link without an error' });
    });
    container.on('disconnected', (ctx) => {
        if (isClosing()) return;
        const e = ctx.error;
        onError({
            condition: 'disconnected',
            description: e ? String(e.message || e) : 'transport closed before the AMQP connection was closed',
        });
    });
    container.on('protocol_error', (e) => {
        onError({ condition: 'protocol-error', description: String(e && e.message ? e.message : e) });
    });
    container.on('error', (e) => {
        onError(toErrorInfo(e, 'error'));
    });
}

module.exports = {
    EXIT_OK,
    EXIT_AMQP_ERROR,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    parseCli,
    parseIntOption,
    connectOptions,
    usageError,
    emit,
    finish,
    toErrorInfo,
    installErrorHandlers,
};
