#!/usr/bin/env node
'use strict';
// AMQP 1.0 test sender built on rhea. See README.md for the output contract.

const rhea = require('rhea');
const common = require('./common.js');

const USAGE = `usage: node send.js --url amqp://HOST:PORT --address ADDR --count N
                    [--prefix ID] [--presettled] [--durable] [--sizes S1,S2,...]
                    [--username U --password P] [--sasl auto|anonymous|plain|none]
                    [--hostname H] [--timeout-ms T] [--tls-insecure]`;

const values = common.parseCli(USAGE, {
    prefix: { type: 'string', default: 'rhea' },
    presettled: { type: 'boolean', default: false },
    durable: { type: 'boolean', default: false },
    // --sizes S1,S2,...: message seq gets a binary body (one data section) of
    // sizes[seq % n] bytes instead of the string body
    sizes: { type: 'string' },
});
if (values.address === undefined) common.usageError(USAGE, '--address is required');
const count = common.parseIntOption(USAGE, values, 'count', { required: true });
const timeoutMs = common.parseIntOption(USAGE, values, 'timeout-ms', { fallback: 30000 });
const prefix = values.prefix;
const presettled = values.presettled;
const connOpts = common.connectOptions(USAGE, values);
const sizes = values.sizes === undefined ? null : values.sizes.split(',').map((field) => {
    if (!/^\d+$/.test(field.trim())) common.usageError(USAGE, `--sizes: ${JSON.stringify(field)} is not a byte count`);
    return Number(field.trim());
});

const result = { sent: 0, accepted: 0, released: 0, rejected: 0, modified: 0, error: null };
let outcomes = 0;       // deliveries whose outcome/settlement has been seen
let closing = false;    // we initiated the connection close
let reported = false;

function report(error, code) {
    if (reported) return;
    reported = true;
    result.error = error;
    common.finish(result, code);
}

function fail(info) {
    report(info, info.condition === 'timeout' ? common.EXIT_TIMEOUT : common.EXIT_AMQP_ERROR);
}

const container = rhea.create_container({ id: connOpts.container_id });
common.installErrorHandlers(container, 'sender', fail, () => closing);

if (timeoutMs > 0) {
    setTimeout(() => {
        fail({
            condition: 'timeout',
            description: closing
                ? `timed out after ${timeoutMs} ms waiting for the connection close`
                : `timed out after ${timeoutMs} ms (sent ${result.sent}/${count}, outcomes ${outcomes})`,
        });
    }, timeoutMs);
}

function maybeComplete() {
    if (closing || reported) return;
    if (result.sent < count) return;
    if (!presettled && outcomes < count) return;
    closing = true;
    connection.close();
}

container.on('connection_close', (ctx) => {
    if (closing && !ctx.connection.error) report(null, common.EXIT_OK);
});

// Messages handed to rhea but not yet written as transfers. rhea's send()
// only queues into the session buffer; link credit is decremented when the
// transfer is actually written, so sender.sendable() stays true for up to
// 2048 queued messages regardless of credit. Track the backlog ourselves so
// we never queue more than the peer has granted.
function unwritten(sender) {
    const out = sender.session && sender.session.outgoing;
    if (out && Number.isInteger(out.next_delivery_id) && Number.isInteger(out.next_pending_delivery)) {
        return out.next_delivery_id - out.next_pending_delivery;
    }
    return Math.max(0, result.sent - sender.delivery_count);
}

function pump(sender) {
    while (!closing && result.sent < count && sender.sendable() && sender.credit - unwritten(sender) > 0) {
        const seq = result.sent;
        const msg = {
            message_id: `${prefix}-${seq}`,
            application_properties: { producer: prefix, seq },
            body: sizes ? rhea.message.data_section(Buffer.alloc(sizes[seq % sizes.length]))
                : `message ${seq} from ${prefix}`,
        };
        if (values.durable) msg.durable = true;
        sender.send(msg);
        result.sent++;
    }
    maybeComplete();
}

container.on('sender_open', (ctx) => {
    // A peer refusing the link answers the attach with a null target and then
    // detaches with an error; that detach is reported by the error handlers.
    if (ctx.sender.remote.attach && !ctx.sender.remote.attach.target) return;
    pump(ctx.sender);
});
container.on('sendable', (ctx) => pump(ctx.sender));

function onOutcome(kind) {
    return (ctx) => {
        const d = ctx.delivery;
        if (d.__fedgate_counted) return;
        d.__fedgate_counted = true;
        result[kind]++;
        outcomes++;
        if (kind === 'rejected' && d.remote_state && d.remote_state.error) {
            process.stderr.write(`rejected: ${JSON.stringify(d.remote_state.error)}\n`);
        }
        // Outcome without settlement (receiver-settle-mode second): settle it.
        if (!d.remote_settled && !d.settled) d.update(true);
        maybeComplete();
    };
}
for (const kind of ['accepted', 'released', 'rejected', 'modified']) {
    container.on(kind, onOutcome(kind));
}
container.on('settled', (ctx) => {
    const d = ctx.delivery;
    if (d.__fedgate_counted) return;
    // Settled by the peer without any outcome: counts as done, no outcome bucket.
    d.__fedgate_counted = true;
    outcomes++;
    process.stderr.write(`delivery ${d.id} settled by peer without an outcome\n`);
    maybeComplete();
});

const senderOpts = { target: { address: values.address } };
if (presettled) senderOpts.snd_settle_mode = 1; // settled
const connection = container.connect(connOpts);
connection.open_sender(senderOpts);
