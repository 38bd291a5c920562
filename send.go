package pgque

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
)

// Send sends one event and returns its event id once it is committed.
//
// While Config.SendConcurrency statements are already running for this
// client's Sends, a Send waits for one of them to finish and then goes out
// with every other Send that waited for the same queue and type, in one
// send_batch call and one transaction (a Send that waits 100 ms without
// one runs its own; events with a DedupKey always do). A failing event is then sent again
// alone, so each Send gets its own outcome and never fails for another's
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

// SendBatch sends events atomically, in one transaction, and returns their
// event ids in input order. Events keep their order: within a key they are
// consumed in the order given.
func (c *Client) SendBatch(ctx context.Context, queue string, events []Event) (_ []int64, err error) {
	ctx, end := c.observeSend(ctx, SendInfo{Queue: queue, Events: len(events)})
	defer func() { end(err) }()
	runs, err := typeRuns(events)
	if err != nil {
		return nil, fmt.Errorf("sending batch to queue %q: %w", queue, err)
	}
	if len(runs) <= 1 {
		// One statement is atomic on its own: no transaction round trips.
		return c.sendRuns(ctx, c.queries, queue, runs)
	}
	var ids []int64
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		ids, err = c.sendRuns(ctx, dbq.New(tx), queue, runs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// SendBatchTx sends events inside the caller's transaction and returns their
// event ids in input order.
func (c *Client) SendBatchTx(ctx context.Context, tx pgx.Tx, queue string, events []Event) (_ []int64, err error) {
	ctx, end := c.observeSend(ctx, SendInfo{Queue: queue, Events: len(events), InTx: true})
	defer func() { end(err) }()
	runs, err := typeRuns(events)
	if err != nil {
		return nil, fmt.Errorf("sending batch to queue %q: %w", queue, err)
	}
	return c.sendRuns(ctx, dbq.New(tx), queue, runs)
}

// run is a maximal sequence of consecutive events of one type: send_batch
// takes one type per call, and splitting on type changes (rather than
// grouping by type) keeps the input order.
type run struct {
	typ      string
	payloads []string
	keys     []*string
	hasKey   bool
	dedups   []*string
	hasDedup bool
}

// typeRuns encodes every event (so an invalid payload fails before the
// database is touched) and cuts the batch into runs.
func typeRuns(events []Event) ([]run, error) {
	var runs []run
	for i, ev := range events {
		typ, payload, key, dedup, err := ev.encode()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if len(runs) == 0 || runs[len(runs)-1].typ != typ {
			runs = append(runs, run{typ: typ})
		}
		r := &runs[len(runs)-1]
		r.payloads = append(r.payloads, string(payload))
		r.keys = append(r.keys, key)
		r.hasKey = r.hasKey || key != nil
		r.dedups = append(r.dedups, dedup)
		r.hasDedup = r.hasDedup || dedup != nil
	}
	return runs, nil
}

// sendRuns sends each run with one send_batch call.
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
func (c *Client) sendRuns(ctx context.Context, q *dbq.Queries, queue string, runs []run) ([]int64, error) {
	var ids []int64
	for _, r := range runs {
		keys, dedups := r.keys, r.dedups
		if !r.hasKey {
			keys = nil
		}
		if !r.hasDedup {
			dedups = nil
		}
		got, err := q.SendBatch(ctx, queue, r.typ, r.payloads, keys, dedups)
		if err != nil {
			return nil, mapError(fmt.Sprintf("sending batch to queue %q", queue), err)
		}
		ids = append(ids, got...)
	}
	c.metrics.Sent.WithLabelValues(queue).Add(float64(len(ids)))
	return ids, nil
}
