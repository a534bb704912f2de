#!/usr/bin/env node
'use strict';
// AMQP 1.0 test receiver built on rhea. See README.md for the output contract.

const rhea = require('rhea');
const common = require('./common.js');

const USAGE = `usage: node receive.js --url amqp://HOST:PORT (--address ADDR | --dynamic) --count N
                    [--credit C] [--idle-ms I] [--timeout-ms T]
                    [--username U --password P] [--sasl auto|anonymous|plain|none]
                    [--hostname H] [--tls-insecure] [--announce] [--selector S]`;

const values = common.parseCli(USAGE, {
    credit: { type: 'string', default: '100' },
    'idle-ms': { type: 'string' },
    dynamic: { type: 'boolean', default: false },
    // --announce: print {"attached": ADDRESS} once the peer has attached the link,
    // so a test knows the receiver is in place before it goes on
    announce: { type: 'boolean', default: false },
    // --selector S: a JMS selector as rhea sends it (rhea.filter.selector: the
    // apache.org:selector-filter:string source filter)
    selector: { type: 'string' },
});
if (values.dynamic && values.address !== undefined) common.usageError(USAGE, '--address and --dynamic are mutually exclusive');
if (!values.dynamic && values.address === undefined) common.usageError(USAGE, '--address (or --dynamic) is required');
const count = common.parseIntOption(USAGE, values, 'count', { required: true }); // 0 = no limit
const credit = common.parseIntOption(USAGE, values, 'credit', { min: 1, fallback: 100 });
const idleMs = common.parseIntOption(USAGE, values, 'idle-ms', { min: 1, fallback: undefined });
const timeoutMs = common.parseIntOption(USAGE, values, 'timeout-ms', { fallback: 30000 });
const connOpts = common.connectOptions(USAGE, values);

let received = 0;
let closing = false;
let reported = false;
let idleTimer;

function report(error, code) {
    if (reported) return;
    reported = true;
    common.finish({ done: error === null, received, error }, code);
}

function fail(info) {
    report(info, info.condition === 'timeout' ? common.EXIT_TIMEOUT : common.EXIT_AMQP_ERROR);
}

const container = rhea.create_container({ id: connOpts.container_id });
common.installErrorHandlers(container, 'receiver', fail, () => closing);

if (timeoutMs > 0) {
    setTimeout(() => {
        fail({
            condition: 'timeout',
            description: closing
                ? `timed out after ${timeoutMs} ms waiting for the connection close`
                : `timed out after ${timeoutMs} ms (received ${received}/${count})`,
        });
    }, timeoutMs);
}

function complete() {
    if (closing || reported) return;
    closing = true;
    if (idleTimer) clearTimeout(idleTimer);
    // Closing the connection flushes the pending accept dispositions first.
    connection.close();
}

container.on('connection_close', (ctx) => {
    if (closing && !ctx.connection.error) report(null, common.EXIT_OK);
});

function armIdle() {
    if (idleMs === undefined || closing) return;
    if (idleTimer) clearTimeout(idleTimer);
    idleTimer = setTimeout(complete, idleMs);
}

// Manual flow control: never hold more credit than messages still wanted, so
// a receiver asked for N messages does not pull (and then release) extra ones
// from a shared queue. Replenish once at most half of the window is left.
function topUp(receiver) {
    if (closing) return;
    const remaining = count > 0 ? count - received : Infinity;
    const target = Math.min(credit, remaining);
    const deficit = target - receiver.credit;
    if (deficit > 0 && receiver.credit <= Math.floor(credit / 2)) receiver.flow(deficit);
}

function jsonable(v) {
    if (v === undefined) return null;
    if (Buffer.isBuffer(v)) return v.length === 16 ? rhea.uuid_to_string(v) : v.toString('hex');
    if (typeof v === 'bigint') return v.toString();
    if (v !== null && typeof v === 'object' && typeof v.toJSON !== 'function' && v.value !== undefined) return jsonable(v.value);
    return v;
}

// The body's length in bytes: its data sections', or a string's (UTF-8) or binary
// value's; null for any other body.
function bodySize(body) {
    if (typeof body === 'string') return Buffer.byteLength(body);
    if (Buffer.isBuffer(body)) return body.length;
    if (body && body.typecode === 0x75) {
        const sections = body.multiple ? body.content : [body.content];
        return sections.reduce((total, section) => total + section.length, 0);
    }
    return null;
}

container.on('receiver_open', (ctx) => {
    const src = ctx.receiver.remote.attach && ctx.receiver.remote.attach.source;
    // A peer refusing the link answers with a null source and then detaches
    // with an error; that detach is reported by the error handlers.
    if (!src) return;
    if (values.dynamic) {
        if (!src.address) {
            fail({ condition: 'dynamic-address-missing', description: 'peer attached a dynamic source without an address' });
            return;
        }
        common.emit({ dynamic_address: src.address });
    }
    if (values.announce) common.emit({ attached: src.address });
    armIdle();
});

container.on('message', (ctx) => {
    if (closing || reported) return;
    const msg = ctx.message;
    ctx.delivery.accept();
    received++;
    const props = msg.application_properties || {};
    common.emit({
        id: jsonable(msg.message_id),
        producer: jsonable(props.producer),
        seq: jsonable(props.seq),
        delivery_count: msg.delivery_count === undefined ? 0 : msg.delivery_count,
        size: bodySize(msg.body),
    });
    if (count > 0 && received >= count) {
        complete();
    } else {
        topUp(ctx.receiver);
        armIdle();
    }
});

const receiverOpts = {
    source: values.dynamic ? { dynamic: true } : { address: values.address },
    ...(values.selector !== undefined
        ? { source: { ...(values.dynamic ? { dynamic: true } : { address: values.address }),
                      filter: rhea.filter.selector(values.selector) } }
        : {}),
    credit_window: 0,   // disable rhea's automatic window (default 1000)
    autoaccept: false,  // accept explicitly
};
const connection = container.connect(connOpts);
const receiver = connection.open_receiver(receiverOpts);
topUp(receiver);
