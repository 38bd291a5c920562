package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
)

// Held horizon and catch-up: the product's defaults (Go Ticker, 10 ms ticks,
// maint every 30 s, a 16-slot PartitionedConsumer) under the two conditions
// that used to hurt a low-latency PgQ-style log.
//
// held: a producer sends single events with keys at a set rate while a
// REPEATABLE READ transaction holds the xmin horizon for the whole run, so
// nothing can be pruned. Every sample records the consumed rate, the lag,
// the cost of one receive+ack chunk of 100 (a plain probe subscription on
// the same queue, timed over a few chunks) and the dead tuples of pgque's
// tables. Targets: the consumer keeps up, receive+ack at the end costs at
// most 1.25x the start, dead tuples do not grow with the batches.
//
// catchup: single sends at 500 events/s with the consumer stopped (about 5
// events per 10 ms tick), then a default 16-slot pool starts and drains the
// backlog; its rate is compared with the production rate (target 20x).

func init() {
	register(&suite{
		name:  "held",
		about: "16-slot pool at 1000 ev/s with a REPEATABLE READ transaction held open: rate, lag, receive+ack cost, dead tuples over time",
		run:   runHeld,
	})
	register(&suite{
		name:  "catchup",
		about: "drain rate of a backlog of single sends made at 500 ev/s (about 5 per tick), 16-slot pool, vs the production rate",
		run:   runCatchup,
	})
}

// heldSample is one point of the held-horizon time series.
type heldSample struct {
	at       time.Duration
	rate     float64 // events handled per second since the last sample
	lag      int64   // sent - handled
	costMS   float64 // one receive+ack chunk of the probe, ms
	dead     int64   // dead tuples in pgque's tables
	deadByTb map[string]int64
}

// deadTuples returns n_dead_tup of pgque's tables (partitions under their
// own names) and the total.
func deadTuples(ctx context.Context, c *pgx.Conn) (int64, map[string]int64, error) {
	if _, err := c.Exec(ctx, "select pg_stat_clear_snapshot()"); err != nil {
		return 0, nil, err
	}
	rows, err := c.Query(ctx, `select relname, n_dead_tup from pg_stat_user_tables where schemaname = 'pgque' and n_dead_tup > 0`)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	per := map[string]int64{}
	var total int64
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return 0, nil, err
		}
		if eventTableRE.MatchString(name) {
			name = "event tables"
		}
		per[name] += n
		total += n
	}
	return total, per, rows.Err()
}

// probeCost times receive+ack of up to chunks chunks of 100 for the plain
// probe subscription and returns the mean per chunk in ms (NaN-free: 0 when
// there was nothing to receive).
func probeCost(ctx context.Context, c *pgx.Conn, queue string, chunks int) (float64, error) {
	var total time.Duration
	n := 0
	for range chunks {
		start := time.Now()
		var batch *int64
		var got int
		rows, err := c.Query(ctx, "select batch_id from pgque.receive($1, 'probe', 100)", queue)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			if err := rows.Scan(&batch); err != nil {
				rows.Close()
				return 0, err
			}
			got++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if got == 0 {
			break
		}
		if _, err := c.Exec(ctx, "select pgque.ack($1)", *batch); err != nil {
			return 0, err
		}
		total += time.Since(start)
		n++
	}
	if n == 0 {
		return 0, nil
	}
	return float64(total.Microseconds()) / 1000 / float64(n), nil
}

// heldBase starts the Go Ticker on a fresh database and returns the client.
func heldBase(ctx context.Context, e *env, name string) (*pgqueDB, *pgque.Client, func(), error) {
	p, err := newPgque(ctx, e, name, 60)
	if err != nil {
		return nil, nil, nil, err
	}
	client, err := pgque.NewClient(p.pool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return nil, nil, nil, err
	}
	ticker, err := client.NewTicker(nil)
	if err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	if err := ticker.Start(ctx); err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	stop := func() {
		ticker.Stop(context.WithoutCancel(ctx))
		client.Close()
	}
	if !waitFor(ctx, 30*time.Second, ticker.IsLeader) {
		stop()
		return nil, nil, nil, fmt.Errorf("the ticker did not become leader within 30s")
	}
	return p, client, stop, nil
}

func runHeld(ctx context.Context, e *env, r *recorder) error {
	p, client, stop, err := heldBase(ctx, e, "bench_held")
	if err != nil {
		return err
	}
	defer stop()
	const rate = 1000
	d := pick(e, 60*time.Second, 30*time.Minute)
	every := pick(e, 5*time.Second, 60*time.Second)
	q := p.fresh("held")
	if _, err := client.CreateQueue(ctx, q); err != nil {
		return err
	}
	if _, err := p.pool.Exec(ctx, "select pgque.subscribe($1, 'probe')", q); err != nil {
		return err
	}
	var handled atomic.Int64
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: q, Consumer: "held", Slots: 16,
		Handler: func(ctx context.Context, m *pgque.Message) error { handled.Add(1); return nil }})
	if err != nil {
		return err
	}
	if err := pc.Start(ctx); err != nil {
		return err
	}
	defer pc.Stop(context.WithoutCancel(ctx))
	if !waitFor(ctx, 30*time.Second, func() bool { return len(pc.OwnedSlots()) == 16 }) {
		return fmt.Errorf("the 16-slot consumer did not own its slots within 30s")
	}

	// The held horizon: a REPEATABLE READ snapshot for the whole run.
	holdConn, err := pgx.Connect(ctx, p.dsn)
	if err != nil {
		return err
	}
	defer holdConn.Close(context.WithoutCancel(ctx))
	htx, err := holdConn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return err
	}
	defer htx.Rollback(context.WithoutCancel(ctx))
	if _, err := htx.Exec(ctx, "select txid_current()"); err != nil {
		return err
	}
	probe, err := pgx.Connect(ctx, p.dsn)
	if err != nil {
		return err
	}
	defer probe.Close(context.WithoutCancel(ctx))

	var sent atomic.Int64
	total := int(float64(rate) * d.Seconds())
	prodCtx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	prodErr := make(chan error, 1)
	go func() {
		_, _, err := paced(prodCtx, rate, total, 16, func(ctx context.Context, i int) error {
			_, err := client.Send(ctx, q, pgque.Event{Type: eventType, Payload: json.RawMessage(payload(i)), PartitionKey: tenantKey(i)})
			if err == nil {
				sent.Add(1)
			}
			return err
		})
		prodErr <- err
	}()

	var samples []heldSample
	start := time.Now()
	lastHandled, lastAt := int64(0), start
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(start.Add(time.Duration(len(samples)+1) * every))):
		}
		now := time.Now()
		h := handled.Load()
		cost, err := probeCost(ctx, probe, q, 5)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		dead, per, err := deadTuples(ctx, probe)
		if err != nil {
			return err
		}
		s := heldSample{at: now.Sub(start), rate: float64(h-lastHandled) / now.Sub(lastAt).Seconds(),
			lag: sent.Load() - h, costMS: cost, dead: dead, deadByTb: per}
		samples = append(samples, s)
		lastHandled, lastAt = h, now
		e.logf("   t=%4.0fs consumed %6.0f ev/s lag %6d receive+ack %6.2f ms dead tuples %d %s",
			s.at.Seconds(), s.rate, s.lag, s.costMS, s.dead, fmtDead(per))
		if now.Sub(start) >= d {
			break
		}
	}
	cancelProd()
	if err := <-prodErr; err != nil && ctx.Err() == nil && !strings.Contains(err.Error(), "context canceled") {
		return fmt.Errorf("producer: %w", err)
	}

	first, last := samples[0], samples[len(samples)-1]
	var maxLag int64
	var minRate float64 = -1
	for _, s := range samples {
		maxLag = max(maxLag, s.lag)
		if minRate < 0 || s.rate < minRate {
			minRate = s.rate
		}
		r.add(fmt.Sprintf("t%04.0fs_consumed", s.at.Seconds()), single(s.rate), "events/s", nil, "")
		r.add(fmt.Sprintf("t%04.0fs_receive_ack", s.at.Seconds()), single(s.costMS), "ms per chunk of 100", nil, "")
		r.add(fmt.Sprintf("t%04.0fs_dead_tuples", s.at.Seconds()), single(float64(s.dead)), "dead tuples", nil, fmtDead(s.deadByTb))
	}
	note := fmt.Sprintf("%d s at %d ev/s with a REPEATABLE READ transaction held open, 16 slots, Go Ticker defaults", int(d.Seconds()), rate)
	r.compare("receive_ack_end", single(last.costMS), "receive_ack_start", single(first.costMS), "ms", valueAtMostRatio(1.25), note)
	r.add("lag_max", single(float64(maxLag)), "events", valueAtMost(float64(rate)), "bounded lag: at most one second of production")
	r.add("dead_tuples_end", single(float64(last.dead)), "dead tuples", nil, fmtDead(last.deadByTb))
	r.compare("dead_tuples_growth", single(float64(last.dead)), "dead_tuples_first_sample", single(float64(max(first.dead, 1))),
		"dead tuples", valueAtMostRatio(2), "does not grow with the batches")
	return nil
}

// valueAtMostRatio is a ratio ceiling.
func valueAtMostRatio(r float64) *target { return &target{on: "ratio", op: "<=", bound: r} }

func fmtDead(per map[string]int64) string {
	var names []string
	for n := range per {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", n, per[n]))
	}
	return strings.Join(parts, " ")
}

func runCatchup(ctx context.Context, e *env, r *recorder) error {
	p, client, stop, err := heldBase(ctx, e, "bench_catchup")
	if err != nil {
		return err
	}
	defer stop()
	const rate = 500
	d := pick(e, 8*time.Second, 20*time.Second)
	q := p.fresh("catchup")
	if _, err := client.CreateQueue(ctx, q); err != nil {
		return err
	}
	for k := range 16 {
		if _, err := p.pool.Exec(ctx, "select pgque.subscribe_slot($1, 'c', $2, 16)", q, k); err != nil {
			return err
		}
	}
	if err := routeIndexes(ctx, p.pool); err != nil {
		return err
	}
	total := int(float64(rate) * d.Seconds())
	sent, took, err := paced(ctx, rate, total, 16, func(ctx context.Context, i int) error {
		_, err := client.Send(ctx, q, pgque.Event{Type: eventType, Payload: json.RawMessage(payload(i)), PartitionKey: tenantKey(i)})
		return err
	})
	if err != nil {
		return err
	}
	produced := float64(sent) / took.Seconds()
	// Let the ticker cut the last tick.
	time.Sleep(200 * time.Millisecond)
	var ticks int64
	if err := p.pool.QueryRow(ctx, "select count(*) from pgque.tick t join pgque.queue q on q.queue_id = t.tick_queue where q.queue_name = $1", q).Scan(&ticks); err != nil {
		return err
	}
	var handled atomic.Int64
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: q, Consumer: "c", Slots: 16,
		Handler: func(ctx context.Context, m *pgque.Message) error { handled.Add(1); return nil }})
	if err != nil {
		return err
	}
	begin := time.Now()
	if err := pc.Start(ctx); err != nil {
		return err
	}
	defer pc.Stop(context.WithoutCancel(ctx))
	if !waitFor(ctx, 10*time.Minute, func() bool { return handled.Load() >= int64(sent) }) {
		return fmt.Errorf("drained %d of %d events", handled.Load(), sent)
	}
	drain := float64(sent) / time.Since(begin).Seconds()
	note := fmt.Sprintf("%d single sends at %s/s over %d ticks (%.1f per tick), drained by a default 16-slot pool (includes claiming the slots)",
		sent, fmtNum(produced), ticks, float64(sent)/float64(max(ticks, 1)))
	r.compare("drain_16_slots", single(drain), "production_rate", single(produced), "events/s", atLeast(20), note)
	return nil
}
