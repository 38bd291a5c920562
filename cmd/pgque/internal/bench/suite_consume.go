package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pgque/pgque"
)

// Consuming. First one plain consumer's read path in SQL (receive of up to
// 1000 + ack, each in its own transaction) against PgQ's (next_batch +
// get_batch_events + finish_batch) over the same backlog: ticks of 1000
// events. Then the Go PartitionedConsumer with N = 1..16 slots draining a
// backlog of 1000 tenants' events, with a handler that costs 0 or 2 ms per
// event, against N = 1 (scaling); per-tenant order is checked on every
// event and a violation fails the suite. Last, key lanes (internal/lanes): 16
// slots, 200 tenants, 20 ms handlers at the default MaxWorkers (256) and at 100
// against lanes off; 0 ms with and without lanes; a hot key.

func init() {
	register(&suite{
		name:  "consume",
		about: "plain receive/ack vs PgQ read path; Go PartitionedConsumer N=1..16 at handler cost 0 and 2 ms",
		run:   runConsume,
	})
}

var consumeSlots = []int{1, 2, 4, 8, 16}

func runConsume(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgque(ctx, e, "bench_consume", 40)
	if err != nil {
		return err
	}
	q, err := optionalPgQ(ctx, e)
	if err != nil {
		return err
	}
	client, err := pgque.NewClient(p.pool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return err
	}
	defer client.Close()

	n := pick(e, 3, 5)
	batches := pick(e, 30, 100)
	m, err := e.rounds(ctx, n, withPgQ(q,
		trial{"receive_ack", func(ctx context.Context) (float64, error) { return p.plainReadRate(ctx, batches, drainPlainRaw) }},
		trial{"receive_jsonb_ack", func(ctx context.Context) (float64, error) { return p.plainReadRate(ctx, batches, drainPlain) }},
		trial{"pgq_read_path", func(ctx context.Context) (float64, error) { return q.readRate(ctx, batches) }},
		trial{"go_consumer", func(ctx context.Context) (float64, error) {
			return p.consumerRate(ctx, client, batches*batchSize, true)
		}},
		trial{"go_consumer_nodecode", func(ctx context.Context) (float64, error) {
			return p.consumerRate(ctx, client, batches*batchSize, false)
		}},
		trial{"go_partitioned_N1", func(ctx context.Context) (float64, error) {
			return p.partitionedRate(ctx, client, 1, batches*batchSize, 0)
		}},
	)...)
	if err != nil {
		return err
	}
	backlogNote := fmt.Sprintf("one consumer draining %d ticks of %d events", batches, batchSize)
	r.compare("receive_ack", m["receive_ack"], "pgq_read_path", m["pgq_read_path"], "events/s", atLeast(1.2),
		backlogNote+"; receive_raw(max 1000, ack_batch), which acknowledges the previous chunk and returns the next, payloads as stored,"+
			" vs next_batch + get_batch_events + finish_batch, each call its own transaction")
	r.compare("receive_jsonb_ack", m["receive_jsonb_ack"], "pgq_read_path", m["pgq_read_path"], "events/s", nil,
		backlogNote+"; receive(max 1000), payloads as jsonb, + ack: two calls per chunk")
	r.compare("go_consumer", m["go_consumer"], "pgq_read_path", m["pgq_read_path"], "events/s", nil,
		fmt.Sprintf("%s; the Go Consumer with its defaults (chunks of %d, a handler call per event) and a handler that decodes every payload", backlogNote, pgque.BatchSizeDefault))
	r.compare("go_consumer", m["go_consumer"], "receive_ack", m["receive_ack"], "events/s", nil,
		"what the Go client and a handler that decodes every payload cost over the SQL loop")
	// The Consumer itself against PgQ's loop: a handler that, like that
	// loop with each row, only takes the event (and checks per-key order by
	// id), so the payload decode above is not counted as the client's.
	r.compare("go_consumer_nodecode", m["go_consumer_nodecode"], "pgq_read_path", m["pgq_read_path"], "events/s", atLeast(1),
		backlogNote+"; the Go Consumer with its defaults, a handler that checks per-key order by event id and decodes nothing")
	r.compare("go_consumer_nodecode", m["go_consumer_nodecode"], "go_consumer", m["go_consumer"], "events/s", nil,
		"the same Consumer without the handler's JSON decode")
	r.compare("go_partitioned_N1", m["go_partitioned_N1"], "go_consumer", m["go_consumer"], "events/s", nil,
		"the partition layer's cost at N = 1: PartitionedConsumer with one slot vs a plain Consumer")

	for _, cost := range []time.Duration{0, 2 * time.Millisecond} {
		var trials []trial
		events := map[int]int{}
		for _, slots := range consumeSlots {
			// With a 2 ms handler, N slots handle at most N/2ms events a
			// second: size the backlog to about the same time for every N.
			ev := pick(e, 5000, 50000)
			if cost > 0 {
				ev = slots * pick(e, 200, 1000)
			}
			events[slots] = ev
			trials = append(trials, trial{fmt.Sprintf("N%d", slots), func(ctx context.Context) (float64, error) {
				// Slot scaling: lanes off, one event at a time per slot.
				return p.laneRate(ctx, client, laneRun{slots: slots, events: ev, tenants: tenants, cost: cost, perSlot: 1})
			}})
		}
		pm, err := e.rounds(ctx, pick(e, 1, 3), trials...)
		if err != nil {
			return err
		}
		base := pm["N1"]
		for _, slots := range consumeSlots {
			cse := fmt.Sprintf("partitioned_N%d_cost%s", slots, costName(cost))
			mm := pm[fmt.Sprintf("N%d", slots)]
			note := fmt.Sprintf("%d events of %d tenants, MaxWorkersPerSlot 1 (slot scaling, lanes off), first handler call to last", events[slots], tenants)
			if cost > 0 {
				ideal := float64(slots) / cost.Seconds()
				note += fmt.Sprintf("; ideal %s events/s (N / handler cost): %.0f%% of it", fmtNum(ideal), 100*mm.value/ideal)
			}
			if slots == 1 {
				r.add(cse, mm, "events/s", nil, note)
				continue
			}
			r.compare(cse, mm, fmt.Sprintf("partitioned_N1_cost%s", costName(cost)), base, "events/s", nil, note)
		}
	}
	return runLaneCases(ctx, e, r, p, client)
}

func costName(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}
