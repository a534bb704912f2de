// goamqp-client: a command-line AMQP 1.0 test client built on Azure's go-amqp,
// an implementation that shares no code with proton. The Python tests run it
// as a subprocess, exactly as they run the rhea clients in tests/js, and it
// follows the same output contract (tests/js/README.md): JSON lines on stdout,
// the final one carrying "error".
//
//	goamqp-client send    --url URL --address A --count N [--prefix P] [--presettled] [--durable] [--rate R]
//	                      [--sizes S1,S2,...]
//	goamqp-client receive --url URL --address A --count N [--credit C] [--idle-ms I]
//	                      [--outcome accept|release|reject|modify-failed|modify-undeliverable]
//	                      [--max-message-size B] [--check-body]
//	goamqp-client drain   --url URL --address A [--credit C] [--take N] [--browse]
//	                      [--max-message-size B]
//
// Common: [--username U --password P] [--sasl auto|anonymous|plain|none]
// [--ca FILE | --tls-insecure] (amqps:// URLs) [--timeout-ms T].
//
// send --sizes: message i has a binary body (one data section) of sizes[i % len(sizes)]
// bytes ("SEQ." repeated) instead of the string "message SEQ from PREFIX". receive prints per message
// {"id", "producer", "seq", "delivery_count", "size"} (size: the body's bytes: the data
// sections', or a string or binary value's), then {"done", "received", "error"}.
// --max-message-size B: the receiver's max-message-size (attach); 0 is go-amqp's default
// (none of its own; it keeps the sender's if that is smaller).
//
// drain attaches a receiver with manual credit (--browse: source distribution-mode
// copy), grants --credit C (0 allowed), receives and accepts --take N messages, then
// calls DrainCredit and prints {"drained": true, "drain_ms": F, "received": N, "error":
// null}: drain_ms is the time DrainCredit took, from the drain flow's request to the
// sender's flow that answers it. When DrainCredit fails or the deadline passes (the
// drain went unanswered): "drained": false and the error, exit 2 or 3.
//
// receive --check-body: each message's id must be PRODUCER-SEQ and its body what a test
// sender makes of it (this client's string, or tests/clients/proton_client.py's "message
// SEQ"); a mismatch prints {"bad_body": ...} and exits 4 at once.
//
// Exit codes: 0 ok, 2 AMQP/SASL/transport error, 3 timeout, 4 corrupt message, 64 bad command line.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/go-amqp"
)

const (
	exitOK      = 0
	exitError   = 2
	exitTimeout = 3
	exitCorrupt = 4
	exitUsage   = 64
	// unsettled sends in flight at once; each waits for its outcome in order
	sendWindow = 100
)

type options struct {
	mode, url, address, prefix, username, password, sasl, ca, outcome string
	count, credit, timeoutMS, idleMS, rate, take                      int
	presettled, durable, tlsInsecure, browse, checkBody               bool
	sizes                                                             []int
	maxMessageSize                                                    uint64
}

// parseSizes reads --sizes: comma-separated byte counts, each >= 0.
func parseSizes(text string) ([]int, error) {
	if text == "" {
		return nil, nil
	}
	var sizes []int
	for _, field := range strings.Split(text, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--sizes: %q is not a byte count", field)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "send" && os.Args[1] != "receive" && os.Args[1] != "drain") {
		fmt.Fprintln(os.Stderr, "usage: goamqp-client send|receive|drain --url URL --address A ...")
		os.Exit(exitUsage)
	}
	o := options{mode: os.Args[1]}
	fs := flag.NewFlagSet(o.mode, flag.ContinueOnError)
	fs.StringVar(&o.url, "url", "", "amqp:// or amqps:// URL")
	fs.StringVar(&o.address, "address", "", "node address")
	fs.StringVar(&o.prefix, "prefix", "go", "message id prefix (send)")
	fs.StringVar(&o.username, "username", "", "SASL PLAIN user")
	fs.StringVar(&o.password, "password", "", "SASL PLAIN password")
	fs.StringVar(&o.sasl, "sasl", "auto", "auto|anonymous|plain|none")
	fs.StringVar(&o.ca, "ca", "", "CA certificate file for amqps://")
	fs.StringVar(&o.outcome, "outcome", "accept", "accept|release|reject|modify-failed|modify-undeliverable")
	fs.IntVar(&o.count, "count", 0, "messages to send or receive (receive: 0 = no limit)")
	fs.IntVar(&o.credit, "credit", 100, "receiver credit window")
	fs.IntVar(&o.timeoutMS, "timeout-ms", 30000, "overall deadline; 0 disables")
	fs.IntVar(&o.idleMS, "idle-ms", 0, "receive: stop after this long without a message")
	fs.IntVar(&o.rate, "rate", 0, "send: messages per second (0: as fast as credit allows)")
	fs.BoolVar(&o.presettled, "presettled", false, "send pre-settled (at-most-once)")
	fs.BoolVar(&o.durable, "durable", false, "set header.durable")
	fs.BoolVar(&o.tlsInsecure, "tls-insecure", false, "skip certificate verification")
	sizes := fs.String("sizes", "", "send: body sizes in bytes, S1,S2,... (message i: sizes[i % n])")
	fs.Uint64Var(&o.maxMessageSize, "max-message-size", 0, "receive, drain: the receiver's max-message-size (0: go-amqp's default)")
	fs.IntVar(&o.take, "take", 0, "drain: messages to receive and accept before the drain")
	fs.BoolVar(&o.checkBody, "check-body", false, "receive: each body must be what a test sender makes of its id (exit 4 if not)")
	fs.BoolVar(&o.browse, "browse", false, "drain: attach with source distribution-mode copy (a browser)")
	if err := fs.Parse(os.Args[2:]); err != nil || o.url == "" || o.address == "" ||
		(o.mode == "send" && o.count <= 0) || (o.mode != "drain" && o.credit <= 0) ||
		o.credit < 0 || o.take < 0 {
		fmt.Fprintln(os.Stderr, "error: --url, --address, --count (and --credit > 0; drain: >= 0) are required")
		os.Exit(exitUsage)
	}
	var err error
	if o.sizes, err = parseSizes(*sizes); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(exitUsage)
	}
	ctx := context.Background()
	if o.timeoutMS > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(o.timeoutMS)*time.Millisecond)
		defer cancel()
	}
	switch o.mode {
	case "send":
		os.Exit(send(ctx, o))
	case "drain":
		os.Exit(drain(ctx, o))
	}
	os.Exit(receive(ctx, o))
}

// -- connection ------------------------------------------------------------------

func dial(ctx context.Context, o options) (*amqp.Conn, error) {
	u, err := url.Parse(o.url)
	if err != nil {
		return nil, err
	}
	user, password := o.username, o.password
	if u.User != nil && user == "" {
		user = u.User.Username()
		password, _ = u.User.Password()
	}
	opts := &amqp.ConnOptions{ContainerID: fmt.Sprintf("goamqp-%d", os.Getpid())}
	switch {
	case o.sasl == "plain" || (o.sasl == "auto" && user != ""):
		opts.SASLType = amqp.SASLTypePlain(user, password)
	case o.sasl == "anonymous" || o.sasl == "auto":
		opts.SASLType = amqp.SASLTypeAnonymous()
	case o.sasl == "none":
		// no SASL layer: the bare AMQP header
	default:
		return nil, fmt.Errorf("unknown --sasl %q", o.sasl)
	}
	if u.Scheme == "amqps" {
		config := &tls.Config{ServerName: u.Hostname(), InsecureSkipVerify: o.tlsInsecure}
		if o.ca != "" {
			pem, err := os.ReadFile(o.ca)
			if err != nil {
				return nil, err
			}
			config.RootCAs = x509.NewCertPool()
			config.RootCAs.AppendCertsFromPEM(pem)
		}
		opts.TLSConfig = config
	}
	address := u.Scheme + "://" + u.Host // credentials stay out of go-amqp's URL handling
	return amqp.Dial(ctx, address, opts)
}

// -- output ----------------------------------------------------------------------

func emit(line map[string]any) {
	data, _ := json.Marshal(line)
	os.Stdout.Write(append(data, '\n'))
}

// describe turns an error into the contract's {"condition", "description"}.
func describe(ctx context.Context, err error) (map[string]any, int) {
	if err == nil {
		return nil, exitOK
	}
	var amqpErr *amqp.Error
	var connErr *amqp.ConnError
	var sessErr *amqp.SessionError
	var linkErr *amqp.LinkError
	switch {
	case errors.As(err, &amqpErr):
		return map[string]any{"condition": string(amqpErr.Condition), "description": amqpErr.Description}, exitError
	case errors.As(err, &connErr) && connErr.RemoteErr != nil:
		return describe(ctx, connErr.RemoteErr)
	case errors.As(err, &sessErr) && sessErr.RemoteErr != nil:
		return describe(ctx, sessErr.RemoteErr)
	case errors.As(err, &linkErr) && linkErr.RemoteErr != nil:
		return describe(ctx, linkErr.RemoteErr)
	case errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
		return map[string]any{"condition": "timeout", "description": err.Error()}, exitTimeout
	}
	return map[string]any{"condition": "error", "description": err.Error()}, exitError
}

// -- send ------------------------------------------------------------------------

func send(ctx context.Context, o options) int {
	result := map[string]any{}
	// outcomes are counted by the goroutine that waits for them, sent by the main one;
	// finish reads both once that goroutine is done
	counts := map[string]int{"accepted": 0, "released": 0, "rejected": 0, "modified": 0}
	sent := 0
	finish := func(err error) int {
		for k, v := range counts {
			result[k] = v
		}
		result["sent"] = sent
		description, code := describe(ctx, err)
		result["error"] = description
		emit(result)
		return code
	}
	conn, err := dial(ctx, o)
	if err != nil {
		return finish(err)
	}
	defer conn.Close()
	session, err := conn.NewSession(ctx, nil)
	if err != nil {
		return finish(err)
	}
	senderOpts := &amqp.SenderOptions{}
	if o.presettled {
		senderOpts.SettlementMode = amqp.SenderSettleModeSettled.Ptr()
	} else {
		senderOpts.SettlementMode = amqp.SenderSettleModeUnsettled.Ptr()
	}
	sender, err := session.NewSender(ctx, o.address, senderOpts)
	if err != nil {
		return finish(err)
	}
	receipts := make(chan amqp.SendReceipt, sendWindow)
	outcomes := make(chan error, 1)
	go func() { // outcomes in send order
		for receipt := range receipts {
			state, err := receipt.Wait(ctx)
			if err != nil {
				outcomes <- err
				for range receipts {
				}
				return
			}
			switch s := state.(type) {
			case *amqp.StateAccepted:
				counts["accepted"]++
			case *amqp.StateReleased:
				counts["released"]++
			case *amqp.StateModified:
				counts["modified"]++
			case *amqp.StateRejected:
				counts["rejected"]++
				if s.Error != nil {
					fmt.Fprintf(os.Stderr, "rejected: %s %s\n", s.Error.Condition, s.Error.Description)
				}
			}
		}
		outcomes <- nil
	}()
	var sendErr error
	start := time.Now()
	for seq := 0; seq < o.count; seq++ {
		if o.rate > 0 { // keep to the schedule: message seq leaves at seq/rate seconds
			time.Sleep(time.Until(start.Add(time.Duration(seq) * time.Second / time.Duration(o.rate))))
		}
		id := fmt.Sprintf("%s-%d", o.prefix, seq)
		msg := &amqp.Message{Value: fmt.Sprintf("message %d from %s", seq, o.prefix)}
		if len(o.sizes) > 0 {
			msg = amqp.NewMessage(patternBody(seq, o.sizes[seq%len(o.sizes)]))
		}
		msg.Properties = &amqp.MessageProperties{MessageID: id}
		msg.ApplicationProperties = map[string]any{"producer": o.prefix, "seq": int64(seq)}
		if o.durable {
			msg.Header = &amqp.MessageHeader{Durable: true}
		}
		if o.presettled {
			sendErr = sender.Send(ctx, msg, nil)
		} else {
			var receipt amqp.SendReceipt
			receipt, sendErr = sender.SendWithReceipt(ctx, msg, nil)
			if sendErr == nil {
				receipts <- receipt
			}
		}
		if sendErr != nil {
			break
		}
		sent++
	}
	close(receipts)
	if waitErr := <-outcomes; sendErr == nil {
		sendErr = waitErr
	}
	if sendErr == nil && o.presettled {
		// pre-settled transfers have no outcome to wait for, and go-amqp's conn.Close
		// closes the socket without waiting for the peer's close: messages written just
		// before it can be lost (about 1 run in 10 of 1,000 against fedgate). The
		// detach round trip shows the peer read them all first.
		detachCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		sendErr = sender.Close(detachCtx)
		cancel()
	}
	// the connection's close ends the link too (RabbitMQ 3.10 leaves go-amqp's
	// link detach unanswered until the deadline)
	if sendErr == nil {
		sendErr = conn.Close()
	}
	return finish(sendErr)
}

// -- receive ---------------------------------------------------------------------

func settle(ctx context.Context, receiver *amqp.Receiver, msg *amqp.Message, outcome string) error {
	switch outcome {
	case "accept":
		return receiver.AcceptMessage(ctx, msg)
	case "release":
		return receiver.ReleaseMessage(ctx, msg)
	case "reject":
		return receiver.RejectMessage(ctx, msg, &amqp.Error{Condition: "fedgate-test:rejected",
			Description: "rejected by goamqp-client"})
	case "modify-failed":
		return receiver.ModifyMessage(ctx, msg, &amqp.ModifyMessageOptions{DeliveryFailed: true})
	case "modify-undeliverable":
		return receiver.ModifyMessage(ctx, msg, &amqp.ModifyMessageOptions{DeliveryFailed: true,
			UndeliverableHere: true})
	}
	return fmt.Errorf("unknown --outcome %q", outcome)
}

func idString(id any) any {
	switch v := id.(type) {
	case []byte:
		return hex.EncodeToString(v)
	case amqp.UUID:
		return v.String()
	}
	return id
}

// bodySize is the body's length in bytes: its data sections', or a string or binary
// value's; nil for any other body.
func bodySize(msg *amqp.Message) any {
	if len(msg.Data) > 0 {
		size := 0
		for _, section := range msg.Data {
			size += len(section)
		}
		return size
	}
	switch v := msg.Value.(type) {
	case string:
		return len(v)
	case []byte:
		return len(v)
	}
	return nil
}

// messageLine is receive's line for one message.
func messageLine(msg *amqp.Message) map[string]any {
	line := map[string]any{"id": nil, "producer": nil, "seq": nil, "delivery_count": 0,
		"size": bodySize(msg)}
	if msg.Properties != nil {
		line["id"] = idString(msg.Properties.MessageID)
	}
	if msg.ApplicationProperties != nil {
		line["producer"] = msg.ApplicationProperties["producer"]
		line["seq"] = msg.ApplicationProperties["seq"]
	}
	if msg.Header != nil {
		line["delivery_count"] = msg.Header.DeliveryCount
	}
	return line
}

// bodyMatches: the body is what a test sender makes of the message's producer and seq
// (this client's "message SEQ from PRODUCER", or proton_client.py's "message SEQ"), and the
// id is PRODUCER-SEQ.
func bodyMatches(msg *amqp.Message) bool {
	if msg.Properties == nil || msg.ApplicationProperties == nil {
		return false
	}
	producer, seq := msg.ApplicationProperties["producer"], msg.ApplicationProperties["seq"]
	if idString(msg.Properties.MessageID) != fmt.Sprintf("%v-%v", producer, seq) {
		return false
	}
	if len(msg.Data) > 0 { // a sized body (send --sizes): its pattern, whole
		n, ok := seq.(int64)
		return ok && bytes.Equal(bytes.Join(msg.Data, nil), patternBody(int(n), bodyLen(msg.Data)))
	}
	body, ok := msg.Value.(string)
	return ok && (body == fmt.Sprintf("message %v", seq) ||
		body == fmt.Sprintf("message %v from %v", seq, producer))
}

// patternBody: send --sizes' body for message seq: "SEQ." repeated, cut to size bytes (a
// body moved, cut or mixed with another message's is seen by --check-body).
func patternBody(seq, size int) []byte {
	unit := []byte(fmt.Sprintf("%d.", seq))
	return bytes.Repeat(unit, size/len(unit)+1)[:size]
}

func bodyLen(sections [][]byte) int {
	size := 0
	for _, section := range sections {
		size += len(section)
	}
	return size
}

func receive(ctx context.Context, o options) int {
	received := 0
	finish := func(err error) int {
		description, code := describe(ctx, err)
		if code == exitTimeout && o.count == 0 {
			description, code = nil, exitOK // no limit: the deadline ends the run
		}
		emit(map[string]any{"done": err == nil || code == exitOK, "received": received,
			"error": description})
		return code
	}
	conn, err := dial(ctx, o)
	if err != nil {
		return finish(err)
	}
	defer conn.Close()
	session, err := conn.NewSession(ctx, nil)
	if err != nil {
		return finish(err)
	}
	// manual credit: never more than min(credit, count - received) outstanding, so
	// a receiver asked for N messages never takes more than N off a queue
	receiver, err := session.NewReceiver(ctx, o.address, &amqp.ReceiverOptions{Credit: -1,
		MaxMessageSize: o.maxMessageSize})
	if err != nil {
		return finish(err)
	}
	outstanding := 0
	topUp := func() error {
		window := o.credit
		if o.count > 0 && o.count-received < window {
			window = o.count - received
		}
		if outstanding*2 > window || window-outstanding <= 0 {
			return nil
		}
		grant := window - outstanding
		outstanding += grant
		return receiver.IssueCredit(uint32(grant))
	}
	for o.count == 0 || received < o.count {
		if err := topUp(); err != nil {
			return finish(err)
		}
		waitCtx, cancel := ctx, context.CancelFunc(func() {})
		if o.idleMS > 0 {
			waitCtx, cancel = context.WithTimeout(ctx, time.Duration(o.idleMS)*time.Millisecond)
		}
		msg, err := receiver.Receive(waitCtx, nil)
		idle := err != nil && ctx.Err() == nil && waitCtx.Err() != nil
		cancel()
		if idle {
			break
		}
		if err != nil {
			return finish(err)
		}
		outstanding--
		received++
		line := messageLine(msg)
		if o.checkBody && !bodyMatches(msg) {
			emit(map[string]any{"bad_body": map[string]any{"id": line["id"],
				"body": fmt.Sprintf("%.200v", msg.Value), "producer": line["producer"], "seq": line["seq"]}})
			emit(map[string]any{"done": false, "received": received, "error": map[string]any{
				"condition": "corrupt-message", "description": fmt.Sprintf("%v", line["id"])}})
			return exitCorrupt
		}
		if err := settle(ctx, receiver, msg, o.outcome); err != nil {
			return finish(err)
		}
		emit(line)
	}
	return finish(conn.Close()) // ends the link too (see send)
}

// -- drain -----------------------------------------------------------------------

// drain: credit, --take messages, then DrainCredit, timed (see the file's note).
func drain(ctx context.Context, o options) int {
	received := 0
	result := map[string]any{"drained": false, "drain_ms": nil}
	finish := func(err error) int {
		description, code := describe(ctx, err)
		result["received"] = received
		result["error"] = description
		emit(result)
		return code
	}
	conn, err := dial(ctx, o)
	if err != nil {
		return finish(err)
	}
	defer conn.Close()
	session, err := conn.NewSession(ctx, nil)
	if err != nil {
		return finish(err)
	}
	receiverOpts := &amqp.ReceiverOptions{Credit: -1, MaxMessageSize: o.maxMessageSize}
	if o.browse {
		receiverOpts.SourceDistributionMode = amqp.SourceDistributionModeCopy
	}
	receiver, err := session.NewReceiver(ctx, o.address, receiverOpts)
	if err != nil {
		return finish(err)
	}
	if o.credit > 0 {
		if err := receiver.IssueCredit(uint32(o.credit)); err != nil {
			return finish(err)
		}
	}
	for received < o.take {
		msg, err := receiver.Receive(ctx, nil)
		if err != nil {
			return finish(err)
		}
		received++
		if err := receiver.AcceptMessage(ctx, msg); err != nil {
			return finish(err)
		}
	}
	start := time.Now()
	if err := receiver.DrainCredit(ctx, nil); err != nil {
		return finish(err)
	}
	result["drain_ms"] = float64(time.Since(start).Microseconds()) / 1000
	result["drained"] = true
	return finish(conn.Close())
}
