#!/usr/bin/env node
'use strict';
// Token renewal on $cbs with rhea, as rhea-promise's CbsClient and Azure's SDKs do it:
// a sender and a receiver on "$cbs", a put-token request (application-properties
// operation, type, name, expiration; the token as the body), the answer's status-code
// matched by correlation-id. Then, optionally, after --wait-ms, one message sent to
// --address on the same connection. See README.md for the output contract.

const rhea = require('rhea');
const common = require('./common.js');

const USAGE = `usage: node cbs.js --url amqp://HOST:PORT --username U --password TOKEN --token NEW
                    [--type jwt] [--name AUDIENCE] [--address ADDR --wait-ms MS] [--timeout-ms T]`;

const values = common.parseCli(USAGE, {
    token: { type: 'string' },
    type: { type: 'string', default: 'jwt' },
    name: { type: 'string', default: 'fedgate' },
    'wait-ms': { type: 'string', default: '0' },
});
if (values.token === undefined) common.usageError(USAGE, '--token is required');
const waitMs = common.parseIntOption(USAGE, values, 'wait-ms', { fallback: 0 });
const timeoutMs = common.parseIntOption(USAGE, values, 'timeout-ms', { fallback: 30000 });
const connOpts = common.connectOptions(USAGE, values);

const result = { status_code: null, status_description: null, correlated: false, sent: null, error: null };
let closing = false;
let reported = false;
let connection = null;

function report(error) {
    if (reported) return;
    reported = true;
    result.error = error;
    closing = true;
    const code = error ? (error.condition === 'timeout' ? 3 : 2) : 0;
    if (connection && connection.is_open()) {
        connection.close();
        connection.once('connection_close', () => common.finish(result, code));
        setTimeout(() => common.finish(result, code), 2000).unref();
    } else {
        common.finish(result, code);
    }
}

const container = rhea.create_container();
common.installErrorHandlers(container, 'sender', report, () => closing);
if (timeoutMs > 0) setTimeout(() => report({ condition: 'timeout', description: `no result in ${timeoutMs} ms` }), timeoutMs).unref();

const requestId = `put-token-${process.pid}`;
let cbsSender = null;
let cbsReceiver = null;
let requested = false;

function maybeRequest() {
    if (requested || !cbsSender || !cbsSender.sendable() || !cbsReceiver || !cbsReceiver.is_open()) return;
    requested = true;
    cbsSender.send({
        message_id: requestId,
        reply_to: 'cbs',
        body: values.token,
        application_properties: {
            operation: 'put-token',
            type: values.type,
            name: values.name,
            expiration: Math.floor(Date.now() / 1000) + 300,
        },
    });
}

function sendAfterwards() {
    if (values.address === undefined) { report(null); return; }
    setTimeout(() => {
        const sender = connection.open_sender(values.address);
        sender.once('sendable', () => sender.send({ body: 'after put-token' }));
        sender.once('accepted', () => { result.sent = 'accepted'; report(null); });
        sender.once('rejected', (ctx) => { result.sent = 'rejected'; report(common.toErrorInfo(ctx.delivery.remote_state && ctx.delivery.remote_state.error, 'rejected')); });
    }, waitMs);
}

container.on('connection_open', (ctx) => {
    connection = ctx.connection;
    cbsReceiver = connection.open_receiver({ source: { address: '$cbs' }, target: { address: 'cbs' }, credit_window: 10 });
    cbsSender = connection.open_sender({ target: { address: '$cbs' } });
});
container.on('receiver_open', maybeRequest);
container.on('sendable', maybeRequest);
container.on('message', (ctx) => {
    const props = ctx.message.application_properties || {};
    result.status_code = props['status-code'];
    result.status_description = props['status-description'];
    result.correlated = ctx.message.correlation_id === requestId;
    if (result.status_code === 202) sendAfterwards();
    else report(null);
});

connection = container.connect(connOpts);
