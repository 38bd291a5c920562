package pgque

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/dbq"
)

// Send sends one event and returns its event id once it is committed.
//
// While Config.SendConcurrency statements are already running for this
// client's Sends, a Send waits for one of them to finish and then goes out
// with every other Send that waited for the same queue, of any type, in
// one send_batch call and one transaction (a Send that waits 100 ms
// without one runs its own; events with a DedupKey always do). A failing
// event is then sent again alone, so each Send gets its own outcome and never fails for another's
// event; sends made one after another from one goroutine keep their order.
// Sends to one queue run at most half the pool's connections in statements
// at once, and Sends of one DedupKey one: a Send past that waits without a
// connection, so that a queue or key stuck on a lock leaves the rest of the
// pool to other queues.
// If ctx ends while the Send waits, it returns ctx's error and the event
// is not sent; if ctx ends while its statement runs, the error is returned
// at once and the event may still be committed, as with any statement.
func (c *Client) Send(ctx context.Context, queue string, ev Event) (id int64, err error) {
	ctx, end := c.observeSend(ctx, SendInfo{Queue: queue, Events: 1, Key: ev.keyRef()})
	defer func() { end(err) }()
	if c.sends == nil {
		return c.send(ctx, c.queries, queue, ev)
	}
	if ev.DedupKey != "" {
		return c.sends.sendKeyed(ctx, queue, ev)
	}
	typ, payload, key, _, err := ev.encode()
	if err != nil {
		return 0, fmt.Errorf("sending to queue %q: %w", queue, err)
	}
	return c.sends.send(ctx, &sendReq{queue: queue, typ: typ, payload: payload, key: key})
}

// SendTx sends one event inside the caller's transaction: the event is
// committed, and becomes visible to consumers, exactly when tx commits, and
// vanishes if it rolls back.
func (c *Client) SendTx(ctx context.Context, tx pgx.Tx, queue string, ev Event) (id int64, err error) {
	ctx, end := c.observeSend(ctx, SendInfo{Queue: queue, Events: 1, Key: ev.keyRef(), InTx: true})
	defer func() { end(err) }()
	return c.send(ctx, dbq.New(tx), queue, ev)
}

func (c *Client) send(ctx context.Context, q *dbq.Queries, queue string, ev Event) (int64, error) {
	typ, payload, key, dedup, err := ev.encode()
	if err != nil {
		return 0, fmt.Errorf("sending to queue %q: %w", queue, err)
	}
	return c.sendOne(ctx, q, queue, typ, payload, key, dedup)
}

// sendOne sends one encoded event with one send call.
func (c *Client) sendOne(ctx context.Context, q *dbq.Queries, queue, typ string, payload json.RawMessage, key, dedup *string) (int64, error) {
	id, err := q.Send(ctx, queue, typ, payload, key, dedup)
	if err != nil {
		return 0, mapError(fmt.Sprintf("sending to queue %q", queue), err)
	}
	c.metrics.Sent.WithLabelValues(queue).Inc()
	return id, nil
}

// SendBatch sends events atomically, in one statement, and returns their
// event ids in input order. Events keep their order, whatever their types:
// within a key they are consumed in the order given. When one event is
// refused, nothing is sent and the error names the event by its index
// ("event 3: ..."), also for what the server refuses (an escape jsonb
// cannot hold, such as the \u0000 json.Marshal writes for a NUL).
func (c *Client) SendBatch(ctx context.Context, queue string, events []Event) (_ []int64, err error) {
	ctx, end := c.observeSend(ctx, SendInfo{Queue: queue, Events: len(events)})
	defer func() { end(err) }()
	b, err := encodeBatch(events)
	if err != nil {
		return nil, fmt.Errorf("sending batch to queue %q: %w", queue, err)
	}
	return c.sendBatch(ctx, c.queries, queue, b)
}

// SendBatchTx sends events inside the caller's transaction and returns their
// event ids in input order.
func (c *Client) SendBatchTx(ctx context.Context, tx pgx.Tx, queue string, events []Event) (_ []int64, err error) {
	ctx, end := c.observeSend(ctx, SendInfo{Queue: queue, Events: len(events), InTx: true})
	defer func() { end(err) }()
	b, err := encodeBatch(events)
	if err != nil {
		return nil, fmt.Errorf("sending batch to queue %q: %w", queue, err)
	}
	return c.sendBatch(ctx, dbq.New(tx), queue, b)
}

// encodedBatch is a batch of encoded events, as send_batch's arrays. keys and
// dedups go as NULL when no event has one, which spares the server the
// array and the dedup path.
type encodedBatch struct {
	types    []string
	mixed    bool // not every event has types[0]
	payloads []string
	keys     []*string
	hasKey   bool
	dedups   []*string
	hasDedup bool
}

// add appends one encoded event.
func (b *encodedBatch) add(typ string, payload json.RawMessage, key, dedup *string) {
	b.mixed = b.mixed || (len(b.types) > 0 && typ != b.types[0])
	b.types = append(b.types, typ)
	b.payloads = append(b.payloads, string(payload))
	b.keys = append(b.keys, key)
	b.hasKey = b.hasKey || key != nil
	b.dedups = append(b.dedups, dedup)
	b.hasDedup = b.hasDedup || dedup != nil
}

// encodeBatch encodes every event, so that an invalid payload fails before
// the database is touched.
func encodeBatch(events []Event) (encodedBatch, error) {
	var b encodedBatch
	for i, ev := range events {
		typ, payload, key, dedup, err := ev.encode()
		if err != nil {
			return encodedBatch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.add(typ, payload, key, dedup)
	}
	return b, nil
}

// sendBatch sends b with one send_batch call: the single-type form when
// every event has one type (one type on the wire instead of one per
// event), the mixed-type form otherwise. Either is one statement, so the
// batch is atomic without a transaction of its own.
//
// Why send_batch and not COPY: BenchmarkSend (1,000 keyed events per call,
// 2-core machine, PostgreSQL 15) measured send_batch at 181k events/s,
// COPY at 268k events/s and 1,000 pipelined send calls at 69k events/s.
// COPY is faster but not correct for us: to follow the engine's rules it
// has to read the queue's current table and sequence, pre-allocate ev_ids
// with nextval and write pgque.event directly, which app roles (pgque_writer)
// may not do, which skips the payload's JSON validation, and which breaks
// the day the engine's private layout changes. send_batch is the fastest
// path that goes through the SQL contract.
func (c *Client) sendBatch(ctx context.Context, q *dbq.Queries, queue string, b encodedBatch) ([]int64, error) {
	if len(b.payloads) == 0 {
		return nil, nil
	}
	keys, dedups := b.keys, b.dedups
	if !b.hasKey {
		keys = nil
	}
	if !b.hasDedup {
		dedups = nil
	}
	var ids []int64
	var err error
	if b.mixed {
		ids, err = q.SendBatchTypes(ctx, queue, b.types, b.payloads, keys, dedups)
	} else {
		ids, err = q.SendBatch(ctx, queue, b.types[0], b.payloads, keys, dedups)
	}
	if err != nil {
		doing := fmt.Sprintf("sending batch to queue %q", queue)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			if i := refusedEvent(b.payloads, pgErr.Code); i >= 0 {
				doing += fmt.Sprintf(": event %d", i)
			}
		}
		return nil, mapError(doing, err)
	}
	c.metrics.Sent.WithLabelValues(queue).Add(float64(len(ids)))
	return ids, nil
}

// refusedEvent returns which payload of a batch the server refused with
// code, found again here (the server checks the batch in one statement,
// and its error names no event), or -1. Every payload passed the client's
// own JSON check, so for 22P02 and 22P05 it is the first one holding an
// escape jsonb refuses (refusedEscape); for 54001 (nesting past the
// server's stack depth) the most deeply nested; for 54000 (too long for
// jsonb) the longest. It runs after a refusal only.
func refusedEvent(payloads []string, code string) int {
	switch code {
	case "22P02", "22P05":
		for i, p := range payloads {
			if refusedEscape(p) {
				return i
			}
		}
	case "54000", "54001":
		best, most := -1, -1
		for i, p := range payloads {
			n := len(p)
			if code == "54001" {
				n = nesting(p)
			}
			if n > most {
				best, most = i, n
			}
		}
		return best
	}
	return -1
}

// refusedEscape reports whether JSON text p holds an escape jsonb refuses:
// \u0000, or a UTF-16 surrogate's that is not half of a pair (a high one
// followed at once by a low one).
func refusedEscape(p string) bool {
	hex4 := func(at int) (uint64, bool) {
		if at+4 > len(p) {
			return 0, false
		}
		v, err := strconv.ParseUint(p[at:at+4], 16, 16)
		return v, err == nil
	}
	for i := 0; i < len(p); i++ {
		if p[i] != '\\' || i+1 >= len(p) {
			continue
		}
		if p[i+1] != 'u' {
			i++ // an escaped character: a backslash, a quote, ...
			continue
		}
		v, ok := hex4(i + 2)
		if !ok {
			continue
		}
		switch {
		case v == 0, v >= 0xDC00 && v <= 0xDFFF:
			return true
		case v >= 0xD800 && v <= 0xDBFF:
			if w, ok := hex4(i + 8); !ok || p[i+6] != '\\' || p[i+7] != 'u' || w < 0xDC00 || w > 0xDFFF {
				return true
			}
			i += 6 // the low half
		}
		i += 5
	}
	return false
}

// nesting returns the deepest nesting of arrays and objects in JSON text p.
func nesting(p string) int {
	depth, most, inString := 0, 0, false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case inString && c == '\\':
			i++
		case inString:
			inString = c != '"'
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}
