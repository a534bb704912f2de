/* txsend: a quiet C sender for bench/transactions.py, with or without AMQP transactions.

     txsend HOST PORT ADDRESS COUNT BATCH [BODY_BYTES=100 [DURABLE=0]]

   BATCH 0: COUNT messages sent unsettled as the receiver's credit allows, each waited for
   (accepted), as .build/bench/send does. BATCH N > 0: the same messages in transactions of N
   (AMQP 1.0 §4): a coordinator link, a declare, N transfers carrying transactional-state
   (the txn-id), then the discharge (commit); the next declare goes out with the discharge, so
   a transaction costs one round trip more than its messages. Every transfer's answer
   (transactional-state with accepted) and every discharge's (accepted) is checked.

   Exit status 0 once COUNT messages are answered and every transaction committed; 1 on any
   error (refused declare or commit, rejected message, a link or the connection closed with an
   error). Prints one summary line. DURABLE 1 sets the header's durable field on every message. Built by .ci/install/c-clients-txn.sh (proton's proactor). */

#include <proton/codec.h>
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/disposition.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DECLARE 0x31
#define DISCHARGE 0x32
#define DECLARED 0x33
#define TRANSACTIONAL_STATE 0x34
#define ACCEPTED 0x24

typedef struct {
    const char *address;
    long count, batch;
    size_t body_bytes;
    int durable;
    pn_proactor_t *proactor;
    pn_link_t *sender, *coordinator;
    pn_delivery_t *declare, *discharge;  /* outstanding control transfers */
    char txn[64];                        /* the current transaction's id */
    size_t txn_size;
    int have_txn;
    long sent, answered, in_txn, committed, declared;
    long tags;
    char *buffer;
    size_t buffer_size;
    char *body;
    int failed, finished;
} app_t;

static void fail(app_t *app, const char *what, pn_condition_t *cond) {
    fprintf(stderr, "txsend: %s%s%s%s%s\n", what, cond ? ": " : "",
            cond && pn_condition_get_name(cond) ? pn_condition_get_name(cond) : "",
            cond ? " " : "",
            cond && pn_condition_get_description(cond) ? pn_condition_get_description(cond) : "");
    app->failed = 1;
}

static pn_delivery_t *send_encoded(app_t *app, pn_link_t *link, pn_message_t *message) {
    size_t size = app->buffer_size;
    int err;
    while ((err = pn_message_encode(message, app->buffer, &size)) == PN_OVERFLOW) {
        app->buffer_size *= 2;
        app->buffer = realloc(app->buffer, app->buffer_size);
        size = app->buffer_size;
    }
    if (err) {
        fail(app, "encode failed", NULL);
        return NULL;
    }
    char tag[24];
    int tag_size = snprintf(tag, sizeof tag, "%ld", ++app->tags);
    pn_delivery_t *d = pn_delivery(link, pn_dtag(tag, (size_t)tag_size));
    pn_link_send(link, app->buffer, size);
    pn_link_advance(link);
    return d;
}

/* A declare or discharge: a message whose body is the described list (§4.5.1, §4.5.3). */
static pn_delivery_t *send_control(app_t *app, int discharge) {
    pn_message_t *message = pn_message();
    pn_data_t *body = pn_message_body(message);
    pn_data_put_described(body);
    pn_data_enter(body);
    pn_data_put_ulong(body, discharge ? DISCHARGE : DECLARE);
    pn_data_put_list(body);
    pn_data_enter(body);
    if (discharge) {
        pn_data_put_binary(body, pn_bytes(app->txn_size, app->txn));
        pn_data_put_bool(body, false);
    }
    pn_data_exit(body);
    pn_data_exit(body);
    pn_delivery_t *d = send_encoded(app, app->coordinator, message);
    pn_message_free(message);
    return d;
}

static void send_messages(app_t *app) {
    if (app->batch && (!app->have_txn || app->discharge))
        return;  /* waiting for the next transaction */
    while (pn_link_credit(app->sender) > 0 && app->sent < app->count
           && (!app->batch || app->in_txn < app->batch)) {
        pn_message_t *message = pn_message();
        pn_message_set_durable(message, app->durable);
        snprintf(app->body, app->body_bytes + 1, "seq=%ld;", app->sent);
        pn_data_put_binary(pn_message_body(message), pn_bytes(app->body_bytes, app->body));
        pn_delivery_t *d = send_encoded(app, app->sender, message);
        pn_message_free(message);
        if (!d)
            return;
        if (app->batch) {  /* §4.4.1: the transfer carries the transaction */
            pn_data_t *state = pn_disposition_data(pn_delivery_local(d));
            pn_data_put_list(state);
            pn_data_enter(state);
            pn_data_put_binary(state, pn_bytes(app->txn_size, app->txn));
            pn_data_exit(state);
            pn_delivery_update(d, TRANSACTIONAL_STATE);
            app->in_txn++;
        }
        app->sent++;
    }
    if (app->batch && app->in_txn > 0
        && (app->in_txn == app->batch || app->sent == app->count)) {
        app->discharge = send_control(app, 1);  /* commit; the next one is declared with it */
        app->have_txn = 0;
        if (app->sent < app->count && !app->declare)
            app->declare = send_control(app, 0);
    }
}

static int outcome_ok(pn_delivery_t *d) {
    uint64_t state = pn_delivery_remote_state(d);
    if (state == ACCEPTED)
        return 1;
    if (state != TRANSACTIONAL_STATE)
        return 0;
    pn_data_t *data = pn_disposition_data(pn_delivery_remote(d));
    pn_data_rewind(data);
    if (!pn_data_next(data) || pn_data_type(data) != PN_LIST || pn_data_get_list(data) < 2)
        return 0;
    pn_data_enter(data);
    pn_data_next(data);  /* txn-id */
    if (!pn_data_next(data) || pn_data_type(data) != PN_DESCRIBED)
        return 0;
    pn_data_enter(data);
    pn_data_next(data);
    return pn_data_get_ulong(data) == ACCEPTED;
}

static void on_control(app_t *app, pn_delivery_t *d) {
    uint64_t state = pn_delivery_remote_state(d);
    if (d == app->declare) {
        app->declare = NULL;
        if (state != DECLARED) {
            fail(app, "declare refused", pn_disposition_condition(pn_delivery_remote(d)));
        } else {
            pn_data_t *data = pn_disposition_data(pn_delivery_remote(d));
            pn_data_rewind(data);
            pn_data_next(data);
            pn_data_enter(data);
            pn_data_next(data);
            pn_bytes_t id = pn_data_get_binary(data);
            app->txn_size = id.size < sizeof app->txn ? id.size : sizeof app->txn;
            memcpy(app->txn, id.start, app->txn_size);
            app->have_txn = 1;
            app->in_txn = 0;
            app->declared++;
        }
    } else if (d == app->discharge) {
        app->discharge = NULL;
        if (state != ACCEPTED)
            fail(app, "commit refused", pn_disposition_condition(pn_delivery_remote(d)));
        else
            app->committed++;
    }
    pn_delivery_settle(d);
    if (!app->failed)
        send_messages(app);
}

static void check_done(app_t *app, pn_connection_t *connection) {
    if (app->failed || (app->answered == app->count && !app->discharge && !app->declare)) {
        app->finished = 1;
        pn_connection_close(connection);
    }
}

static void handle(app_t *app, pn_event_t *event) {
    switch (pn_event_type(event)) {
    case PN_CONNECTION_INIT: {
        pn_connection_t *c = pn_event_connection(event);
        pn_connection_set_container(c, "txsend");
        pn_connection_open(c);
        pn_session_t *s = pn_session(c);
        pn_session_open(s);
        app->sender = pn_sender(s, "txsend");
        pn_terminus_set_address(pn_link_target(app->sender), app->address);
        pn_link_set_snd_settle_mode(app->sender, PN_SND_UNSETTLED);
        pn_link_open(app->sender);
        if (app->batch) {
            app->coordinator = pn_sender(s, "txn-ctrl");
            pn_terminus_set_type(pn_link_target(app->coordinator), PN_COORDINATOR);
            pn_link_open(app->coordinator);
            app->declare = send_control(app, 0);
        }
        break;
    }
    case PN_LINK_FLOW:
        if (pn_event_link(event) == app->sender)
            send_messages(app);
        break;
    case PN_DELIVERY: {
        pn_delivery_t *d = pn_event_delivery(event);
        if (!pn_delivery_updated(d) || !pn_delivery_remote_state(d))
            break;
        if (pn_delivery_link(d) == app->coordinator) {
            on_control(app, d);
        } else {
            if (!outcome_ok(d))
                fail(app, "message not accepted", pn_disposition_condition(pn_delivery_remote(d)));
            app->answered++;
            pn_delivery_settle(d);
        }
        check_done(app, pn_event_connection(event));
        break;
    }
    case PN_LINK_REMOTE_CLOSE:
        if (pn_condition_is_set(pn_link_remote_condition(pn_event_link(event))))
            fail(app, "link closed", pn_link_remote_condition(pn_event_link(event)));
        pn_connection_close(pn_event_connection(event));
        break;
    case PN_TRANSPORT_CLOSED:
        if (pn_condition_is_set(pn_transport_condition(pn_event_transport(event))) && !app->finished)
            fail(app, "connection lost", pn_transport_condition(pn_event_transport(event)));
        break;
    default:
        break;
    }
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: txsend HOST PORT ADDRESS COUNT BATCH [BODY_BYTES=100 [DURABLE=0]]\n");
        return 2;
    }
    app_t app = {0};
    app.address = argv[3];
    app.count = atol(argv[4]);
    app.batch = atol(argv[5]);
    app.body_bytes = argc > 6 ? (size_t)atol(argv[6]) : 100;
    app.durable = argc > 7 && atoi(argv[7]) != 0;
    app.buffer_size = app.body_bytes + 512;
    app.buffer = malloc(app.buffer_size);
    app.body = malloc(app.body_bytes + 16);
    memset(app.body, 'x', app.body_bytes + 16);
    app.proactor = pn_proactor();
    char addr[256];
    pn_proactor_addr(addr, sizeof addr, argv[1], argv[2]);
    pn_proactor_connect2(app.proactor, NULL, NULL, addr);
    int running = 1;
    while (running) {
        pn_event_batch_t *events = pn_proactor_wait(app.proactor);
        pn_event_t *event;
        while ((event = pn_event_batch_next(events))) {
            handle(&app, event);
            if (pn_event_type(event) == PN_PROACTOR_INACTIVE)
                running = 0;
        }
        pn_proactor_done(app.proactor, events);
    }
    pn_proactor_free(app.proactor);
    printf("txsend: %ld sent, %ld answered, %ld transactions committed%s\n", app.sent, app.answered,
           app.committed, app.failed ? " (FAILED)" : "");
    free(app.buffer);
    free(app.body);
    return app.failed || app.answered != app.count ? 1 : 0;
}
