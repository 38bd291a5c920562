package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
)

// The costs of the pause failure policy, measured against the same work
// without them:
//
// pause_no_failures: a 4-slot PartitionedConsumer drains a backlog under
// the pause policy and under skip, with handlers that never fail. Pause
// keeps nothing aside without a failure, so it should drain as fast
// (target 0.9x at least).
//
// healthy_beside_blocked: one slot holds a blocked key (its head fails,
// retried in an hour) with its later events set aside; the healthy keys
// of that slot drain a backlog beside it, against the same drain on a
// slot without a blocked key. The held events are set aside once each,
// not read again by every poll, so the healthy keys keep most of their
// throughput (target 0.8x; about 0.7 today: a slot with a blocked key
// looks up key_block for every row it delivers).

func init() {
	register(&suite{
		name:  "pause",
		about: "pause vs skip without failures; healthy keys beside a blocked key with its events held vs without",
		run:   runPause,
	})
}

// hotKey is the key the blocked-key case blocks; no tenantKey equals it.
const hotKey = "hot"

func runPause(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgque(ctx, e, "bench_pause", 40)
	if err != nil {
		return err
	}
	client, err := pgque.NewClient(p.pool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return err
	}
	defer client.Close()
	events := pick(e, 20000, 100000)
	held := pick(e, 4000, 10000)
	healthy := pick(e, 5000, 20000)
	n := pick(e, 3, 5)
	drain := func(policy pgque.FailurePolicy) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return p.partitionedRateWith(ctx, client, 4, events, 0, func(c *pgque.PartitionedConsumerConfig) {
				c.FailurePolicy = policy
				// One event at a time per slot, as the comparison
				// is of the policies' bookkeeping, not of lanes.
				c.MaxWorkersPerSlot = 1
			})
		}
	}
	m, err := e.rounds(ctx, n,
		trial{"drain_skip", drain(pgque.FailurePolicySkip)},
		trial{"drain_pause", drain(pgque.FailurePolicyPause)},
		trial{"healthy_unblocked", func(ctx context.Context) (float64, error) {
			return p.besideBlockedRate(ctx, client, healthy, held, false)
		}},
		trial{"healthy_beside_blocked", func(ctx context.Context) (float64, error) {
			return p.besideBlockedRate(ctx, client, healthy, held, true)
		}},
	)
	if err != nil {
		return err
	}
	const u = "events/s"
	r.compare("pause_no_failures", m["drain_pause"], "skip_no_failures", m["drain_skip"], u, atLeast(0.9),
		fmt.Sprintf("4-slot PartitionedConsumer draining %d events, handlers never fail", events))
	r.compare("healthy_beside_blocked", m["healthy_beside_blocked"], "healthy_unblocked", m["healthy_unblocked"], u, atLeast(0.8),
		fmt.Sprintf("one slot: %d healthy events drained beside a blocked key holding %d events vs without it", healthy, held))
	return nil
}

// besideBlockedRate runs a one-slot PartitionedConsumer under the pause
// policy on a fresh queue. It first sends 1+held events of hotKey: with
// block, the first fails (retried in an hour) and the test waits until the
// held others are set aside; without, it waits until all are handled, so
// that both cases start from the same queue, tables and warmed-up
// consumer. It then sends a backlog of events healthy events in one
// transaction, makes it visible in one tick and returns the rate at which
// the consumer drains it, checking per-tenant order.
func (p *pgqueDB) besideBlockedRate(ctx context.Context, client *pgque.Client, events, held int, block bool) (float64, error) {
	q := p.fresh("blocked")
	if _, err := p.pool.Exec(ctx, "select pgque.create_queue($1)", q); err != nil {
		return 0, err
	}
	oc := newOrderCheck(events)
	healthy := oc.handler(0)
	var hotDone atomic.Int64
	handle := func(ctx context.Context, m *pgque.Message) error {
		switch {
		case m.PartitionKey != hotKey:
			return healthy(ctx, m)
		case block:
			return fmt.Errorf("the blocked key's head keeps failing")
		}
		hotDone.Add(1)
		return nil
	}
	tk, err := client.NewTicker(&pgque.TickerConfig{WorkerID: "bench-" + q})
	if err != nil {
		return 0, err
	}
	if err := tk.Start(ctx); err != nil {
		return 0, err
	}
	defer stopWithin(ctx, tk.Stop)
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: q, Consumer: "c", Slots: 1, FailurePolicy: pgque.FailurePolicyPause, Handler: handle,
		PollInterval: 50 * time.Millisecond,
		RetryDelay:   func(int) time.Duration { return time.Hour },
	})
	if err != nil {
		return 0, err
	}
	if err := pc.Start(ctx); err != nil {
		return 0, err
	}
	defer stopWithin(ctx, pc.Stop)
	if err := sendHot(ctx, p, q, 1); err != nil {
		return 0, err
	}
	if block {
		if err := waitBlocked(ctx, client, q, func(b pgque.BlockedKey) bool { return b.State == pgque.BlockStateBlocked }); err != nil {
			return 0, fmt.Errorf("blocking %s: %w", hotKey, err)
		}
	}
	if err := sendHot(ctx, p, q, held); err != nil {
		return 0, err
	}
	if block {
		if err := waitBlocked(ctx, client, q, func(b pgque.BlockedKey) bool { return b.Deferred == int64(held) }); err != nil {
			return 0, fmt.Errorf("holding %d events of %s: %w", held, hotKey, err)
		}
	} else if !waitFor(ctx, time.Minute, func() bool { return hotDone.Load() == int64(1+held) }) {
		return 0, fmt.Errorf("only %d of %d events of %s handled", hotDone.Load(), 1+held, hotKey)
	}
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		for from := 0; from < events; from += batchSize {
			payloads, keys := batchPayloads(from, min(batchSize, events-from))
			if _, err := tx.Exec(ctx, `select pgque.send_batch($1, $2, $3::jsonb[], $4::text[])`, q, eventType, payloads, keys); err != nil {
				return fmt.Errorf("send_batch: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := tickPool(ctx, p, q); err != nil {
		return 0, err
	}
	if err := oc.wait(ctx, drainTimeout(events, 0, 1)); err != nil {
		return 0, err
	}
	if v := oc.violations.Load(); v > 0 {
		return 0, fmt.Errorf("%d events delivered out of per-tenant order", v)
	}
	return oc.rate(), nil
}

// sendHot sends n events of hotKey to queue in one transaction and ticks.
func sendHot(ctx context.Context, p *pgqueDB, queue string, n int) error {
	payloads, keys := batchPayloads(0, n)
	for i := range keys {
		keys[i] = hotKey
	}
	if _, err := p.pool.Exec(ctx, `select pgque.send_batch($1, $2, $3::jsonb[], $4::text[])`, queue, eventType, payloads, keys); err != nil {
		return fmt.Errorf("send_batch: %w", err)
	}
	return tickPool(ctx, p, queue)
}

// tickPool is tick on a connection of p's pool.
func tickPool(ctx context.Context, p *pgqueDB, queue string) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return tick(ctx, conn.Conn(), queue)
}

// waitBlocked waits until hotKey's block on queue satisfies ok, for a
// minute at most.
func waitBlocked(ctx context.Context, client *pgque.Client, queue string, ok func(pgque.BlockedKey) bool) error {
	var last []pgque.BlockedKey
	var lerr error
	if waitFor(ctx, time.Minute, func() bool {
		last, lerr = client.BlockedKeys(ctx, queue, "c")
		for _, b := range last {
			if b.Key == pgque.KeyOf(hotKey) && ok(b) {
				return true
			}
		}
		return false
	}) {
		return nil
	}
	if lerr != nil {
		return lerr
	}
	return fmt.Errorf("timed out; blocked keys %+v", last)
}

// stopWithin calls stop with a bounded context that outlives ctx, so a
// cancelled run still stops what it started.
func stopWithin(ctx context.Context, stop func(context.Context) error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = stop(sctx)
}
