package fedgate;

import jakarta.jms.BytesMessage;
import jakarta.jms.Connection;
import jakarta.jms.DeliveryMode;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageProducer;
import jakarta.jms.Queue;
import jakarta.jms.QueueBrowser;
import jakarta.jms.Session;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TextMessage;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;

import org.apache.qpid.jms.JmsConnection;
import org.apache.qpid.jms.JmsConnectionFactory;
import org.apache.qpid.jms.JmsConnectionListener;
import org.apache.qpid.jms.message.JmsInboundMessageDispatch;

/**
 * A Qpid JMS client for fedgate's interoperability tests (tests/test_jms.py).
 *
 * Each command prints JSON lines on stdout; a JMS failure is printed as
 * {"error": ..., "type": ...} and exits 2.
 *
 *   send URL QUEUE COUNT PREFIX [PAUSE_AFTER [TTL_MS [SIZES]]]
 *                                              persistent sends, each waiting for its outcome;
 *                                              after PAUSE_AFTER (0: never) prints {"paused": n}
 *                                              and waits for a line on stdin; TTL_MS: time to live
 *                                              (0: none); SIZES S1,S2,...: message i is a
 *                                              BytesMessage of S[i % n] bytes, not a TextMessage
 *   receive URL QUEUE COUNT IDLE_MS [PAUSE_AFTER]
 *                                              until COUNT (0: any) or IDLE_MS without a
 *                                              message; PAUSE_AFTER as for send. Prints
 *                                              {"ids": [...], "sizes": [...]}: each message's
 *                                              id property and body size in bytes (a
 *                                              BytesMessage's length, a TextMessage's text in
 *                                              UTF-8; null for other bodies), in arrival order
 *   browse URL QUEUE                           a QueueBrowser's enumeration
 *   select URL QUEUE SELECTOR COUNT IDLE_MS    a consumer with a message selector
 *   rpc URL QUEUE COUNT [RESPONDER_URL]        request/reply through a temporary queue; the
 *                                              responder may use another node
 *   transacted URL QUEUE                       a transacted session's send and commit
 *   txsend URL QUEUES COUNT PREFIX BATCH [ROLLBACK_EVERY]
 *                                              a transacted session sends COUNT persistent
 *                                              messages (id property PREFIX-i; QUEUES: one
 *                                              name, or several, comma-separated, taken in
 *                                              turn, one producer each), committing
 *                                              every BATCH; with ROLLBACK_EVERY k > 0 every
 *                                              k-th batch is rolled back instead. Prints
 *                                              {"sent", "committed": [ids], "rolled_back": [ids]}
 *   txreceive URL QUEUE IDLE_MS BATCH [ROLLBACK_EVERY [MAX]]
 *                                              a transacted session receives in batches of
 *                                              BATCH (a batch ends early after IDLE_MS with no
 *                                              message; an empty one ends the run), committing
 *                                              each; with ROLLBACK_EVERY k > 0 every k-th batch
 *                                              (the 1st, the (k+1)-th, ...) is rolled back;
 *                                              stops after MAX committed messages (0: none).
 *                                              Prints {"batches": [{"ids", "redelivered",
 *                                              "outcome": "commit" | "rollback"}],
 *                                              "committed": [ids]}
 *   sendx URL QUEUE SPEC                       persistent sends described by SPEC: messages
 *                                              separated by ';', each ID:PRIORITY:DELAY_MS:PROPS,
 *                                              PROPS k=v pairs separated by ',' (an integer value
 *                                              is an int property, true/false a boolean, else a
 *                                              string); id property ID; prints {"sent": n}
 *   selector-cases URL PREFIX SPEC SELECTOR... for each SELECTOR i: SPEC (as for sendx) sent to
 *                                              PREFIX + i, a consumer with the selector takes
 *                                              what it selects (until 500 ms idle), then one
 *                                              without takes the rest; prints {"cases":
 *                                              [{"selected": [ids], "rest": [ids]} or
 *                                              {"error": ..., "type": ...}]}
 *   publish URL TOPIC SPEC                     sendx to a topic
 *   subscribe URL TOPIC CLIENT_ID NAME IDLE_MS [SELECTOR]
 *                                              a durable subscriber (client id CLIENT_ID;
 *                                              NAME "-": a plain, non-durable one); prints
 *                                              {"ready": true}, takes until IDLE_MS without a
 *                                              message (IDLE_MS may be FIRST_MS/IDLE_MS: up to
 *                                              FIRST_MS for the first one), closes it (the
 *                                              subscription stays);
 *                                              prints {"ids": [...]}
 *   shared URL TOPIC NAME CONSUMERS IDLE_MS DURABLE
 *                                              CONSUMERS shared consumers (JMS 2.0, no client
 *                                              id: global) of NAME; {"ready": true}, then each
 *                                              takes until IDLE_MS without a message once one
 *                                              came (at most 60 s for the first); prints
 *                                              {"consumers": [[ids], ...]}
 *   unsubscribe URL CLIENT_ID NAME             prints {"unsubscribed": NAME} or an error
 *   nolocal URL TOPIC CLIENT_ID OWN_SPEC OTHER_SPEC
 *                                              on one connection (client id CLIENT_ID): a
 *                                              non-durable and a durable (name "nolocal")
 *                                              subscriber with noLocal = true and a plain one;
 *                                              that connection publishes OWN_SPEC, another one
 *                                              OTHER_SPEC (as for sendx); each subscriber takes
 *                                              until 1 s idle; the durable subscription is
 *                                              removed; prints {"nolocal": [ids], "durable":
 *                                              [ids], "plain": [ids]}
 *   poison URL QUEUE IDLE_MS                   a transacted session takes each message and rolls
 *                                              back, until IDLE_MS without one; prints
 *                                              {"deliveries": {id: times}}
 *   nemesis-produce URL QUEUE PROCESS RUN RATE SECONDS
 *                                              the nemesis's JMS producer (tests/nemesis): text
 *                                              messages RUN-PROCESS-n at RATE a second for SECONDS,
 *                                              persistent (each send waits for its outcome; a
 *                                              failover: URL sends again what was in flight);
 *                                              a history line per operation, in Jepsen's shape
 *   nemesis-consume URL QUEUE PROCESS          the nemesis's JMS consumer: records each message
 *                                              as it arrives, then acknowledges it; until SIGTERM
 */
public final class JmsClient {

    public static void main(String[] args) throws Exception {
        try {
            switch (args[0]) {
                case "send" -> send(args[1], args[2], Integer.parseInt(args[3]), args[4],
                                    args.length > 5 ? Integer.parseInt(args[5]) : 0,
                                    args.length > 6 ? Long.parseLong(args[6]) : 0,
                                    args.length > 7 ? sizes(args[7]) : null);
                case "receive" -> receive(args[1], args[2], Integer.parseInt(args[3]),
                                          Long.parseLong(args[4]), null,
                                          args.length > 5 ? Integer.parseInt(args[5]) : 0);
                case "select" -> receive(args[1], args[2], Integer.parseInt(args[4]),
                                         Long.parseLong(args[5]), args[3], 0);
                case "browse" -> browse(args[1], args[2]);
                case "sendx" -> sendx(args[1], args[2], args[3]);
                case "selector-cases" -> selectorCases(args[1], args[2], args[3],
                                                       java.util.Arrays.copyOfRange(args, 4, args.length));
                case "poison" -> poison(args[1], args[2], Long.parseLong(args[3]));
                case "publish" -> publish(args[1], args[2], args[3]);
                case "subscribe" -> subscribe(args[1], args[2], args[3], args[4],
                                              args[5], args.length > 6 ? args[6] : null);
                case "shared" -> shared(args[1], args[2], args[3], Integer.parseInt(args[4]),
                                        Long.parseLong(args[5]), Boolean.parseBoolean(args[6]));
                case "unsubscribe" -> unsubscribe(args[1], args[2], args[3]);
                case "nolocal" -> noLocal(args[1], args[2], args[3], args[4], args[5]);
                case "rpc" -> rpc(args[1], args[2], Integer.parseInt(args[3]),
                                  args.length > 4 ? args[4] : args[1]);
                case "transacted" -> transacted(args[1], args[2]);
                case "txsend" -> txSend(args[1], args[2], Integer.parseInt(args[3]), args[4],
                                        Integer.parseInt(args[5]),
                                        args.length > 6 ? Integer.parseInt(args[6]) : 0);
                case "txreceive" -> txReceive(args[1], args[2], Long.parseLong(args[3]),
                                              Integer.parseInt(args[4]),
                                              args.length > 5 ? Integer.parseInt(args[5]) : 0,
                                              args.length > 6 ? Integer.parseInt(args[6]) : 0);
                case "nemesis-produce" -> nemesisProduce(args[1], args[2], args[3], args[4],
                                                         Double.parseDouble(args[5]),
                                                         Double.parseDouble(args[6]));
                case "nemesis-consume" -> nemesisConsume(args[1], args[2], args[3]);
                default -> throw new IllegalArgumentException("unknown command " + args[0]);
            }
        } catch (JMSException | RuntimeException e) {
            print("{\"error\": " + quote(String.valueOf(e.getMessage())) + ", \"type\": "
                  + quote(e.getClass().getName()) + "}");
            System.exit(2);
        }
        System.exit(0);
    }

    /** Connection events, as JSON lines: where the client is connected, and reconnections. */
    private static final class Events implements JmsConnectionListener {
        public void onConnectionEstablished(URI remote) {
            print("{\"event\": \"established\", \"uri\": " + quote(remote.toString()) + "}");
        }
        public void onConnectionFailure(Throwable error) {
            print("{\"event\": \"failure\", \"error\": " + quote(String.valueOf(error)) + "}");
        }
        public void onConnectionInterrupted(URI remote) {
            print("{\"event\": \"interrupted\", \"uri\": " + quote(remote.toString()) + "}");
        }
        public void onConnectionRestored(URI remote) {
            print("{\"event\": \"restored\", \"uri\": " + quote(remote.toString()) + "}");
        }
        public void onInboundMessage(JmsInboundMessageDispatch envelope) {}
        public void onSessionClosed(Session session, Throwable cause) {}
        public void onConsumerClosed(MessageConsumer consumer, Throwable cause) {}
        public void onProducerClosed(MessageProducer producer, Throwable cause) {}
    }

    private static Connection connect(String url) throws JMSException {
        JmsConnectionFactory factory = new JmsConnectionFactory(url);
        JmsConnection connection = (JmsConnection) factory.createConnection();
        connection.addConnectionListener(new Events());
        connection.start();
        return connection;
    }

    private static int[] sizes(String text) {
        String[] fields = text.split(",");
        int[] sizes = new int[fields.length];
        for (int i = 0; i < fields.length; i++) {
            sizes[i] = Integer.parseInt(fields[i].trim());
            if (sizes[i] < 0) {
                throw new IllegalArgumentException("SIZES: byte counts >= 0, got " + fields[i]);
            }
        }
        return sizes;
    }

    private static void send(String url, String queueName, int count, String prefix, int pauseAfter,
                             long ttlMs, int[] sizes) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            MessageProducer producer = session.createProducer(session.createQueue(queueName));
            producer.setDeliveryMode(DeliveryMode.PERSISTENT);  // each send waits for its outcome
            producer.setTimeToLive(ttlMs);
            for (int i = 0; i < count; i++) {
                if (pauseAfter > 0 && i == pauseAfter) {
                    print("{\"paused\": " + i + "}");
                    new BufferedReader(new InputStreamReader(System.in)).readLine();
                }
                Message message;
                if (sizes == null) {
                    message = session.createTextMessage(prefix + "-" + i);
                } else {
                    BytesMessage bytes = session.createBytesMessage();
                    bytes.writeBytes(new byte[sizes[i % sizes.length]]);
                    message = bytes;
                }
                message.setStringProperty("id", prefix + "-" + i);
                producer.send(message);
            }
            print("{\"sent\": " + count + ", \"uri\": "
                  + quote(String.valueOf(((JmsConnection) connection).getConnectedURI())) + "}");
        }
    }

    private static void receive(String url, String queueName, int count, long idleMs, String selector,
                                int pauseAfter) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            Queue queue = session.createQueue(queueName);
            MessageConsumer consumer = selector == null ? session.createConsumer(queue)
                                                        : session.createConsumer(queue, selector);
            List<String> ids = new ArrayList<>();
            List<String> sizes = new ArrayList<>();
            while (count == 0 || ids.size() < count) {
                if (pauseAfter > 0 && ids.size() == pauseAfter) {
                    print("{\"paused\": " + pauseAfter + "}");
                    new BufferedReader(new InputStreamReader(System.in)).readLine();
                }
                Message message = consumer.receive(idleMs);
                if (message == null) {
                    break;
                }
                ids.add(message.getStringProperty("id"));
                sizes.add(bodySize(message));
            }
            consumer.close();
            print("{\"ids\": " + quoteAll(ids) + ", \"sizes\": [" + String.join(", ", sizes) + "]}");
        }
    }

    /** The body's length in bytes, as JSON: null for a body neither bytes nor text. */
    private static String bodySize(Message message) throws JMSException {
        if (message instanceof BytesMessage bytes) {
            return String.valueOf(bytes.getBodyLength());
        }
        if (message instanceof TextMessage text && text.getText() != null) {
            return String.valueOf(text.getText().getBytes(java.nio.charset.StandardCharsets.UTF_8).length);
        }
        return "null";
    }

    private static void sendx(String url, String queueName, String spec) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            fill(session, session.createProducer(session.createQueue(queueName)), spec);
            print("{\"sent\": " + spec.split(";").length + "}");
        }
    }

    private static void fill(Session session, MessageProducer producer, String spec)
            throws JMSException {
        for (String item : spec.split(";")) {
            String[] f = item.split(":", 4);
            TextMessage message = session.createTextMessage(f[0]);
            message.setStringProperty("id", f[0]);
            if (f.length > 3 && !f[3].isEmpty()) {
                for (String pair : f[3].split(",")) {
                    String[] kv = pair.split("=", 2);
                    if (kv[1].matches("-?[0-9]+")) {
                        message.setIntProperty(kv[0], Integer.parseInt(kv[1]));
                    } else if (kv[1].equals("true") || kv[1].equals("false")) {
                        message.setBooleanProperty(kv[0], Boolean.parseBoolean(kv[1]));
                    } else {
                        message.setStringProperty(kv[0], kv[1]);
                    }
                }
            }
            producer.setDeliveryDelay(Long.parseLong(f[2]));
            producer.send(message, DeliveryMode.PERSISTENT, Integer.parseInt(f[1]), 0);
        }
    }

    private static void publish(String url, String topicName, String spec) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            fill(session, session.createProducer(session.createTopic(topicName)), spec);
            print("{\"sent\": " + spec.split(";").length + "}");
        }
    }

    private static Connection connectAs(String url, String clientId) throws JMSException {
        JmsConnectionFactory factory = new JmsConnectionFactory(url);
        Connection connection = factory.createConnection();
        if (clientId != null) {
            connection.setClientID(clientId);
        }
        connection.start();
        return connection;
    }

    private static void subscribe(String url, String topicName, String clientId, String name,
                                  String idle, String selector) throws Exception {
        // IDLE_MS, or FIRST_MS/IDLE_MS: up to FIRST_MS for the first message, then IDLE_MS
        String[] waits = idle.split("/");
        long idleMs = Long.parseLong(waits[waits.length - 1]);
        long firstMs = Long.parseLong(waits[0]);
        try (Connection connection = connectAs(url, clientId)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            jakarta.jms.Topic topic = session.createTopic(topicName);
            MessageConsumer consumer = name.equals("-")
                ? session.createConsumer(topic, selector)
                : session.createDurableSubscriber(topic, name, selector, false);
            print("{\"ready\": true}");
            List<String> ids = new ArrayList<>();
            Message first = consumer.receive(firstMs);
            if (first != null) {
                ids.add(first.getStringProperty("id"));
                ids.addAll(drain(consumer, idleMs));
            } else {
                consumer.close();
            }
            print("{\"ids\": " + quoteAll(ids) + "}");
        }
    }

    private static void shared(String url, String topicName, String name, int count, long idleMs,
                               boolean durable) throws Exception {
        try (Connection connection = connectAs(url, null)) {
            List<MessageConsumer> consumers = new ArrayList<>();
            List<Session> sessions = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
                jakarta.jms.Topic topic = session.createTopic(topicName);
                sessions.add(session);
                consumers.add(durable ? session.createSharedDurableConsumer(topic, name)
                                      : session.createSharedConsumer(topic, name));
            }
            print("{\"ready\": true}");
            List<List<String>> got = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                got.add(new ArrayList<>());
            }
            // until IDLE_MS without a message once one came (at most 60 s for the first)
            long start = System.currentTimeMillis();
            long last = 0;
            while (last == 0 ? System.currentTimeMillis() - start < 60_000
                             : System.currentTimeMillis() - last < idleMs) {
                for (int i = 0; i < count; i++) {
                    Message message = consumers.get(i).receive(20);
                    if (message != null) {
                        got.get(i).add(message.getStringProperty("id"));
                        last = System.currentTimeMillis();
                    }
                }
            }
            List<String> parts = new ArrayList<>();
            for (List<String> ids : got) {
                parts.add(quoteAll(ids));
            }
            for (MessageConsumer consumer : consumers) {
                consumer.close();
            }
            if (durable) {
                sessions.get(0).unsubscribe(name);
            }
            print("{\"consumers\": [" + String.join(", ", parts) + "]}");
        }
    }

    private static void unsubscribe(String url, String clientId, String name) throws Exception {
        try (Connection connection = connectAs(url, clientId)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            session.unsubscribe(name);
            print("{\"unsubscribed\": " + quote(name) + "}");
        }
    }

    private static void noLocal(String url, String topicName, String clientId, String own,
                                String other) throws Exception {
        try (Connection connection = connectAs(url, clientId)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            jakarta.jms.Topic topic = session.createTopic(topicName);
            MessageConsumer noLocal = session.createConsumer(topic, null, true);
            MessageConsumer durable = session.createDurableSubscriber(topic, "nolocal", null, true);
            MessageConsumer plain = session.createConsumer(topic);
            fill(session, session.createProducer(topic), own);
            try (Connection another = connectAs(url, null)) {
                Session theirs = another.createSession(false, Session.AUTO_ACKNOWLEDGE);
                fill(theirs, theirs.createProducer(theirs.createTopic(topicName)), other);
            }
            String got = quoteAll(drain(noLocal, 1000));
            String kept = quoteAll(drain(durable, 1000));
            String all = quoteAll(drain(plain, 1000));
            session.unsubscribe("nolocal");
            print("{\"nolocal\": " + got + ", \"durable\": " + kept + ", \"plain\": " + all + "}");
        }
    }

    private static List<String> drain(MessageConsumer consumer, long idleMs) throws JMSException {
        List<String> ids = new ArrayList<>();
        Message message;
        while ((message = consumer.receive(idleMs)) != null) {
            ids.add(message.getStringProperty("id"));
        }
        consumer.close();
        return ids;
    }

    private static void selectorCases(String url, String prefix, String spec, String[] selectors)
            throws Exception {
        // the cases share nothing (a queue each): run at once, each on its own connection,
        // so that the 500 ms idle waits overlap instead of adding up
        java.util.concurrent.ExecutorService pool =
            java.util.concurrent.Executors.newFixedThreadPool(selectors.length);
        List<java.util.concurrent.Future<String>> futures = new ArrayList<>();
        for (int i = 0; i < selectors.length; i++) {
            final int index = i;
            futures.add(pool.submit(() -> selectorCase(url, prefix + index, spec, selectors[index])));
        }
        List<String> results = new ArrayList<>();
        for (java.util.concurrent.Future<String> future : futures) {
            try {
                results.add(future.get(120, java.util.concurrent.TimeUnit.SECONDS));
            } catch (java.util.concurrent.ExecutionException e) {
                Throwable cause = e.getCause();
                results.add("{\"error\": " + quote(String.valueOf(cause.getMessage()))
                            + ", \"type\": " + quote(cause.getClass().getName()) + "}");
            }
        }
        pool.shutdownNow();
        print("{\"cases\": [" + String.join(", ", results) + "]}");
    }

    private static String selectorCase(String url, String queueName, String spec, String selector)
            throws Exception {
        sendx(url, queueName, spec);
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            Queue queue = session.createQueue(queueName);
            String selected;
            try {
                selected = quoteAll(drain(session.createConsumer(queue, selector), 500));
            } catch (JMSException e) {
                return "{\"error\": " + quote(String.valueOf(e.getMessage()))
                       + ", \"type\": " + quote(e.getClass().getName()) + "}";
            }
            String rest = quoteAll(drain(session.createConsumer(queue), 500));
            return "{\"selected\": " + selected + ", \"rest\": " + rest + "}";
        }
    }

    private static void poison(String url, String queueName, long idleMs) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(true, Session.SESSION_TRANSACTED);
            MessageConsumer consumer = session.createConsumer(session.createQueue(queueName));
            java.util.Map<String, Integer> times = new java.util.LinkedHashMap<>();
            while (true) {
                Message message = consumer.receive(idleMs);
                if (message == null) {
                    break;
                }
                times.merge(message.getStringProperty("id"), 1, Integer::sum);
                session.rollback();
            }
            consumer.close();
            List<String> parts = new ArrayList<>();
            for (var entry : times.entrySet()) {
                parts.add(quote(entry.getKey()) + ": " + entry.getValue());
            }
            print("{\"deliveries\": {" + String.join(", ", parts) + "}}");
        }
    }

    private static void browse(String url, String queueName) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            QueueBrowser browser = session.createBrowser(session.createQueue(queueName));
            List<String> ids = new ArrayList<>();
            Enumeration<?> messages = browser.getEnumeration();
            while (messages.hasMoreElements()) {
                ids.add(((Message) messages.nextElement()).getStringProperty("id"));
            }
            browser.close();
            print("{\"browsed\": " + quoteAll(ids) + "}");
        }
    }

    /** A responder answers COUNT requests sent with a temporary queue as JMSReplyTo. */
    private static void rpc(String url, String queueName, int count, String responderUrl)
            throws Exception {
        try (Connection server = connect(responderUrl); Connection client = connect(url)) {
            Session serverSession = server.createSession(false, Session.AUTO_ACKNOWLEDGE);
            MessageProducer replies = serverSession.createProducer(null);  // to each JMSReplyTo
            serverSession.createConsumer(serverSession.createQueue(queueName)).setMessageListener(request -> {
                try {
                    TextMessage reply = serverSession.createTextMessage(
                        "re:" + ((TextMessage) request).getText());
                    reply.setJMSCorrelationID(request.getJMSMessageID());
                    replies.send(request.getJMSReplyTo(), reply);
                } catch (JMSException e) {
                    print("{\"responder_error\": " + quote(String.valueOf(e.getMessage())) + "}");
                }
            });
            Session session = client.createSession(false, Session.AUTO_ACKNOWLEDGE);
            TemporaryQueue replyTo = session.createTemporaryQueue();
            MessageConsumer replyConsumer = session.createConsumer(replyTo);
            MessageProducer requests = session.createProducer(session.createQueue(queueName));
            List<String> answers = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                TextMessage request = session.createTextMessage("q" + i);
                request.setJMSReplyTo(replyTo);
                requests.send(request);
                Message reply = replyConsumer.receive(10_000);
                if (reply == null) {
                    break;
                }
                boolean matches = request.getJMSMessageID().equals(reply.getJMSCorrelationID());
                answers.add((matches ? "" : "mismatch:") + ((TextMessage) reply).getText());
            }
            replyConsumer.close();
            replyTo.delete();
            print("{\"replies\": " + quoteAll(answers) + ", \"reply_to\": "
                  + quote(replyTo.getQueueName()) + "}");
        }
    }

    private static void transacted(String url, String queueName) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(true, Session.SESSION_TRANSACTED);
            MessageProducer producer = session.createProducer(session.createQueue(queueName));
            producer.send(session.createTextMessage("tx"));
            session.commit();
            print("{\"committed\": 1}");
        }
    }

    private static void txSend(String url, String queueName, int count, String prefix, int batch,
                               int rollbackEvery) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(true, Session.SESSION_TRANSACTED);
            List<MessageProducer> producers = new ArrayList<>();
            for (String name : queueName.split(",")) {
                MessageProducer one = session.createProducer(session.createQueue(name));
                one.setDeliveryMode(DeliveryMode.PERSISTENT);
                producers.add(one);
            }
            List<String> committed = new ArrayList<>();
            List<String> rolledBack = new ArrayList<>();
            List<String> current = new ArrayList<>();
            int batches = 0;
            for (int i = 0; i < count; i++) {
                TextMessage message = session.createTextMessage(prefix + "-" + i);
                message.setStringProperty("id", prefix + "-" + i);
                producers.get(i % producers.size()).send(message);
                current.add(prefix + "-" + i);
                if (current.size() == batch || i == count - 1) {
                    batches++;
                    if (rollbackEvery > 0 && batches % rollbackEvery == 0) {
                        session.rollback();
                        rolledBack.addAll(current);
                    } else {
                        session.commit();
                        committed.addAll(current);
                    }
                    current.clear();
                }
            }
            print("{\"sent\": " + count + ", \"committed\": " + quoteAll(committed)
                  + ", \"rolled_back\": " + quoteAll(rolledBack) + "}");
        }
    }

    private static void txReceive(String url, String queueName, long idleMs, int batch,
                                  int rollbackEvery, int max) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(true, Session.SESSION_TRANSACTED);
            MessageConsumer consumer = session.createConsumer(session.createQueue(queueName));
            List<String> committed = new ArrayList<>();
            StringBuilder batches = new StringBuilder("[");
            int number = 0;
            while (max == 0 || committed.size() < max) {
                List<String> ids = new ArrayList<>();
                List<String> redelivered = new ArrayList<>();
                while (ids.size() < batch) {
                    Message message = consumer.receive(idleMs);
                    if (message == null) {
                        break;
                    }
                    ids.add(message.getStringProperty("id"));
                    redelivered.add(String.valueOf(message.getJMSRedelivered()));
                }
                if (ids.isEmpty()) {
                    session.commit();
                    break;
                }
                boolean rollback = rollbackEvery > 0 && number % rollbackEvery == 0;
                number++;
                if (rollback) {
                    session.rollback();
                } else {
                    session.commit();
                    committed.addAll(ids);
                }
                batches.append(batches.length() > 1 ? ", " : "").append("{\"ids\": ")
                       .append(quoteAll(ids)).append(", \"redelivered\": [")
                       .append(String.join(", ", redelivered)).append("], \"outcome\": \"")
                       .append(rollback ? "rollback" : "commit").append("\"}");
            }
            consumer.close();
            print("{\"batches\": " + batches.append("]") + ", \"committed\": "
                  + quoteAll(committed) + "}");
        }
    }

    private static void history(String process, String type, String f, String value, String extra) {
        print("{\"process\": " + quote(process) + ", \"type\": " + quote(type) + ", \"f\": "
              + quote(f) + ", \"value\": " + quote(value) + extra + ", \"time\": "
              + (System.currentTimeMillis() / 1000.0) + "}");
    }

    private static void nemesisProduce(String url, String queue, String process, String run,
                                       double rate, double seconds) throws Exception {
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.AUTO_ACKNOWLEDGE);
            MessageProducer producer = session.createProducer(session.createQueue(queue));
            producer.setDeliveryMode(DeliveryMode.PERSISTENT);
            long start = System.nanoTime();
            for (int n = 0; ; n++) {
                long due = start + (long) (n / rate * 1e9);
                if ((due - start) / 1e9 >= seconds) {
                    break;
                }
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
                }
                String value = run + "-" + process + "-" + n;
                history(process, "invoke", "enqueue", value, "");
                try {
                    producer.send(session.createTextMessage(value));
                    history(process, "ok", "enqueue", value, "");
                } catch (JMSException e) {  // no outcome known: it may be in the queue or not
                    history(process, "info", "enqueue", value, ", \"error\": " + quote(e.getMessage()));
                }
            }
        }
        print("{\"process\": " + quote(process) + ", \"done\": true, \"link_closed\": false}");
    }

    private static void nemesisConsume(String url, String queue, String process) throws Exception {
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        java.util.concurrent.CountDownLatch finished = new java.util.concurrent.CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.set(true);
            try {
                finished.await(5, java.util.concurrent.TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        try (Connection connection = connect(url)) {
            Session session = connection.createSession(false, Session.CLIENT_ACKNOWLEDGE);
            MessageConsumer consumer = session.createConsumer(session.createQueue(queue));
            while (!stop.get()) {
                Message message = consumer.receive(200);
                if (message == null) {
                    continue;
                }
                String value = message instanceof TextMessage text ? text.getText()
                        : message.getJMSMessageID();
                int count = message.propertyExists("JMSXDeliveryCount")
                        ? Math.max(0, message.getIntProperty("JMSXDeliveryCount") - 1) : 0;
                history(process, "invoke", "dequeue", null, "");
                history(process, "ok", "dequeue", value, ", \"delivery_count\": " + count);
                message.acknowledge();
            }
        } finally {
            print("{\"process\": " + quote(process) + ", \"done\": true, \"link_closed\": false}");
            finished.countDown();
        }
    }

    private static synchronized void print(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static String quoteAll(List<String> items) {
        StringBuilder out = new StringBuilder("[");
        for (int i = 0; i < items.size(); i++) {
            out.append(i == 0 ? "" : ", ").append(quote(items.get(i)));
        }
        return out.append("]").toString();
    }

    private static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}
