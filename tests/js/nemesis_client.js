#!/usr/bin/env node
'use strict';
// The nemesis's rhea client (issue #42, tests/nemesis/client.py's twin): a rhea container with
// reconnect over a list of URLs, as an application configures it, writing the same history.
//
//   node nemesis_client.js produce --urls U1,U2,U3 --address A --process P --run R
//                                  [--rate 40] [--seconds S] [--grace G] [--durable]
//   node nemesis_client.js consume --urls U1,U2,U3 --address A --process P [--credit 50]
//
// rhea reconnects by itself (the next URL of the list each time) and opens again the links
// it had; a link the server ended is not attached again ("link-closed" is recorded). A
// producer sends again, on the new connection, what had no outcome when it was lost.
// History: one JSON object per line, {"process", "type": "invoke"|"ok"|"fail"|"info",
// "f": "enqueue"|"dequeue", "value", "time"}, plus {"process", "event", ...} lines.

const rhea = require('rhea');
const { parseArgs } = require('node:util');

const { values: opts, positionals } = parseArgs({
    allowPositionals: true,
    options: {
        urls: { type: 'string' }, address: { type: 'string' }, process: { type: 'string' },
        run: { type: 'string', default: 'r' }, rate: { type: 'string', default: '40' },
        seconds: { type: 'string', default: '60' }, grace: { type: 'string', default: '15' },
        credit: { type: 'string', default: '50' }, durable: { type: 'boolean', default: false },
    },
});
const mode = positionals[0];
const proc = opts.process;
const urls = opts.urls.split(',').map((u) => new URL(u));

function emit(fields) {
    fields.process = proc;
    fields.time = Math.round(Date.now() * 1000) / 1e6;
    process.stdout.write(JSON.stringify(fields) + '\n');
}

let attempt = 0;
let lastUrl = null;
const container = rhea.create_container({ id: `nemesis-rhea-${proc}-${process.pid}` });
const connection = container.connect({
    // each (re)connect takes the next URL of the list, the client's own node first
    connection_details: () => {
        const url = urls[attempt++ % urls.length];
        lastUrl = url.host;
        return { host: url.hostname, port: Number(url.port) };
    },
    reconnect: true, initial_reconnect_delay: 100, max_reconnect_delay: 1000,
    // heartbeats (docs/nemesis.md, finding 21): rhea leaves a node silent for twice this
    // (3 s), as the proton clients do
    reconnect_limit: undefined, idle_time_out: 1500, username: 'anonymous',
});
let up = false;
let linkClosed = false;
container.on('connection_open', (ctx) => {
    if (!up) {
        up = true;
        emit({ event: 'reconnected', url: lastUrl });
    }
});
container.on('disconnected', () => {
    if (up) {
        up = false;
        emit({ event: 'disconnected' });
    }
    if (onLost) onLost();
});
function linkClose(ctx) {
    const error = ctx.sender ? ctx.sender.error : ctx.receiver && ctx.receiver.error;
    if (up && !closing) {
        linkClosed = true;
        emit({ event: 'link-closed', condition: error ? error.condition : null,
               description: error ? error.description : null });
    }
}
container.on('sender_close', linkClose);
container.on('receiver_close', linkClose);
container.on('connection_close', (ctx) => {
    const error = ctx.connection.error;
    emit({ event: 'connection-closed', condition: error ? error.condition : null });
});
container.on('error', () => {});
container.on('connection_error', () => {});
container.on('sender_error', () => {});
container.on('receiver_error', () => {});
let onLost = null;
let closing = false;

function finish() {
    emit({ done: true, link_closed: linkClosed });
    closing = true;
    try { connection.close(); } catch (e) { /* already gone */ }
    setTimeout(() => process.exit(0), 200);
}

if (mode === 'produce') {
    const rate = Number(opts.rate), seconds = Number(opts.seconds), grace = Number(opts.grace);
    const sender = connection.open_sender({ target: { address: opts.address }, autosettle: true });
    const inflight = new Map(); // delivery id -> value
    const open = new Map();     // value -> invoke time
    let resend = [];
    let next = 0;
    const started = Date.now() / 1000;
    onLost = () => { // rhea forgets the deliveries of a lost connection: sent again later
        const values = [...inflight.values()].sort((a, b) => Number(a.split('-').pop()) - Number(b.split('-').pop()));
        inflight.clear();
        resend = values.concat(resend.filter((v) => !values.includes(v)));
    };
    function send(value) {
        const delivery = sender.send({ message_id: value, body: value, durable: opts.durable });
        inflight.set(delivery.id, value);
    }
    function outcome(ctx, type, extra) {
        const value = inflight.get(ctx.delivery.id);
        inflight.delete(ctx.delivery.id);
        if (value === undefined || !open.has(value)) return;
        open.delete(value);
        emit(Object.assign({ type, f: 'enqueue', value }, extra || {}));
    }
    container.on('accepted', (ctx) => outcome(ctx, 'ok'));
    container.on('rejected', (ctx) => outcome(ctx, 'fail', { state: 'rejected' }));
    container.on('released', (ctx) => outcome(ctx, 'fail', { state: 'released' }));
    container.on('modified', (ctx) => outcome(ctx, 'fail', { state: 'modified' }));
    function tick() {
        const now = Date.now() / 1000;
        const elapsed = now - started;
        if (elapsed >= seconds + grace || (elapsed >= seconds && open.size === 0 && resend.length === 0)) {
            for (const value of open.keys()) emit({ type: 'info', f: 'enqueue', value });
            finish();
            return;
        }
        if (up && !linkClosed && sender.is_open()) {
            // sendable() counts rhea's own buffer, not the peer's credit: room is the credit
            // less what rhea holds unwritten (as send.js counts it)
            const unwritten = () => {
                const out = sender.session && sender.session.outgoing;
                return out && Number.isInteger(out.next_delivery_id) && Number.isInteger(out.next_pending_delivery)
                    ? out.next_delivery_id - out.next_pending_delivery : 0;
            };
            const room = () => (sender.sendable() ? sender.credit - unwritten() : 0);
            while (resend.length && room() > 0) send(resend.shift());
            const due = Math.floor(elapsed * rate) + 1;
            while (elapsed < seconds && next < due && room() > 0 && resend.length === 0) {
                const value = `${opts.run}-${proc}-${next++}`;
                open.set(value, now);
                emit({ type: 'invoke', f: 'enqueue', value });
                send(value);
            }
        }
        setTimeout(tick, 10);
    }
    setTimeout(tick, 10);
} else {
    const receiver = connection.open_receiver({
        source: { address: opts.address }, autoaccept: false, credit_window: Number(opts.credit),
    });
    container.on('message', (ctx) => {
        emit({ type: 'invoke', f: 'dequeue', value: null });
        const body = ctx.message.body; // the value (a JMS producer's text too)
        emit({ type: 'ok', f: 'dequeue', value: typeof body === 'string' ? body : ctx.message.message_id,
               delivery_count: ctx.message.delivery_count || 0 });
        ctx.delivery.accept();
    });
    process.on('SIGTERM', () => finish());
    void receiver;
}
