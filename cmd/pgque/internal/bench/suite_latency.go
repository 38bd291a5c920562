package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque"
)

// Latency: from send to handler start, at a steady 100, 1k and 10k events
// a second, through the product's own path: producers call Client.Send (16
// goroutines, paced to the rate), the Go Ticker runs with its defaults, and
// a PartitionedConsumer with 4 slots (and, at 1k/s, a plain Consumer)
// handles the events. Each payload carries the time the producer called
// Send, so a figure includes the send's own round trip and commit: it is
// the delay a user would observe, never less.

func init() {
	register(&suite{
		name:  "latency",
		about: "send → handler start p50/p95/p99/max at 100, 1k and 10k events/s (Go Ticker defaults, PartitionedConsumer N=4)",
		run:   runLatency,
	})
}

var latencyRates = []int{100, 1000, 10000}

// latencies collects handler-start delays in milliseconds.
type latencies struct {
	mu     sync.Mutex
	ms     []float64
	seen   atomic.Int64
	seqs   map[int]bool // payload seq numbers handled
	evIDs  []int64      // ev_id Send returned, by seq
	slotOf map[int]int  // seq -> slot that delivered it
}

func (l *latencies) handler() pgque.HandlerFunc {
	return func(ctx context.Context, m *pgque.Message) error {
		now := time.Now()
		var p timedPayload
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return err
		}
		l.mu.Lock()
		if !l.seqs[p.Seq] {
			l.ms = append(l.ms, float64(now.UnixNano()-p.SentNS)/1e6)
			l.seqs[p.Seq] = true
		}
		l.mu.Unlock()
		l.seen.Add(1)
		return nil
	}
}

// missing describes the events that were sent but never handled: their
// ev_id, key and what the database says about them, for the bug report.
func (l *latencies) missing(ctx context.Context, p *pgqueDB, queue string, sent int) error {
	l.mu.Lock()
	var lost []string
	n := 0
	for i := range sent {
		if l.seqs[i] {
			continue
		}
		n++
		if len(lost) < 5 {
			var where string
			err := p.pool.QueryRow(ctx, `select coalesce((select format('in %s, ev_txid %s', tableoid::regclass, ev_txid)
			   from pgque.event where ev_id = $1 and ev_extra1 = $2 limit 1), 'not in any event table')`, l.evIDs[i], tenantKey(i)).Scan(&where)
			if err != nil {
				where = err.Error()
			}
			lost = append(lost, fmt.Sprintf("seq %d ev_id %d key %s (%s)", i, l.evIDs[i], tenantKey(i), where))
		}
	}
	l.mu.Unlock()
	var status string
	_ = p.pool.QueryRow(ctx, `select string_agg(format('slot %s: owner %s lag %s', slot, owner, lag), '; ' order by slot)
	   from pgque.partition_slot_status where queue = $1`, queue).Scan(&status)
	return fmt.Errorf("%d of %d sent events not handled, and none for 30 s (at-least-once violated or delivery stuck): %s; slots: %s",
		n, sent, strings.Join(lost, ", "), status)
}

// paced calls send total times, event i due at start + i/rate, from
// workers goroutines, and returns how many calls it made and how long it
// took.
func paced(ctx context.Context, rate, total, workers int, send func(ctx context.Context, i int) error) (int, time.Duration, error) {
	var next atomic.Int64
	var sent atomic.Int64
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				due := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				if err := send(ctx, i); err != nil {
					cancel(err)
					return
				}
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return int(sent.Load()), time.Since(start), err
	}
	return int(sent.Load()), time.Since(start), nil
}

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// starter is a consumer the latency run can start and stop.
type starter interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// latencyRun sends at rate for d to a fresh queue consumed by the consumer
// that mk builds, and returns the sorted latencies and the achieved rate.
func latencyRun(ctx context.Context, p *pgqueDB, client *pgque.Client, rate int, d time.Duration,
	mk func(queue string, h pgque.HandlerFunc) (starter, func() bool, error)) ([]float64, float64, error) {
	q := p.fresh("lat")
	if _, err := client.CreateQueue(ctx, q); err != nil {
		return nil, 0, err
	}
	l := &latencies{seqs: map[int]bool{}}
	con, ready, err := mk(q, l.handler())
	if err != nil {
		return nil, 0, err
	}
	if err := con.Start(ctx); err != nil {
		return nil, 0, err
	}
	stop := func() error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return con.Stop(stopCtx)
	}
	defer stop() // Stop is idempotent: this only matters on the error paths.
	if !waitFor(ctx, 15*time.Second, ready) {
		return nil, 0, fmt.Errorf("consumer of %s not ready after 15s", q)
	}
	total := int(float64(rate) * d.Seconds())
	l.evIDs = make([]int64, total)
	sent, took, err := paced(ctx, rate, total, 16, func(ctx context.Context, i int) error {
		id, err := client.Send(ctx, q, pgque.Event{Type: eventType, Payload: json.RawMessage(newTimedPayload(i, time.Now())),
			PartitionKey: tenantKey(i)})
		l.evIDs[i] = id
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	handled := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.seqs)
	}
	// Wait while events keep arriving: a loaded machine may take long to
	// drain, but 30 s without progress means delivery is stuck.
	last, lastChange := handled(), time.Now()
	for h := last; h < sent; h = handled() {
		if h != last {
			last, lastChange = h, time.Now()
		}
		if time.Since(lastChange) > 30*time.Second || ctx.Err() != nil {
			return nil, 0, l.missing(ctx, p, q, sent)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		return nil, 0, fmt.Errorf("stopping the consumer: %w", err)
	}
	l.mu.Lock()
	ms := slices.Clone(l.ms)
	l.mu.Unlock()
	slices.Sort(ms)
	return ms, float64(sent) / took.Seconds(), nil
}

func runLatency(ctx context.Context, e *env, r *recorder) error {
	p, client, err := newPgqueClient(ctx, e, "bench_latency", 40)
	if err != nil {
		return err
	}
	defer client.Close()
	ticker, err := client.NewTicker(nil)
	if err != nil {
		return err
	}
	if err := ticker.Start(ctx); err != nil {
		return err
	}
	defer ticker.Stop(context.WithoutCancel(ctx))
	if !waitFor(ctx, 30*time.Second, ticker.IsLeader) {
		return fmt.Errorf("the ticker did not become leader within 30s")
	}

	d := pick(e, 1500*time.Millisecond, 10*time.Second)
	partitioned := func(queue string, h pgque.HandlerFunc) (starter, func() bool, error) {
		pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "lat", Slots: 4, Handler: h})
		if err != nil {
			return nil, nil, err
		}
		return pc, func() bool { return len(pc.OwnedSlots()) == 4 }, nil
	}
	plain := func(queue string, h pgque.HandlerFunc) (starter, func() bool, error) {
		c, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: queue, Consumer: "lat", Handler: h})
		if err != nil {
			return nil, nil, err
		}
		started := time.Now()
		// A plain consumer subscribes in Start and is then at once polling.
		return c, func() bool { return time.Since(started) > 200*time.Millisecond }, nil
	}
	type run struct {
		name string
		rate int
		mk   func(string, pgque.HandlerFunc) (starter, func() bool, error)
	}
	var runs []run
	for _, rate := range latencyRates {
		runs = append(runs, run{fmt.Sprintf("partitioned_N4_%s", rateName(rate)), rate, partitioned})
	}
	runs = append(runs, run{"consumer_1k", 1000, plain})
	var errs []error
	for _, rn := range runs {
		ms, achieved, err := latencyRun(ctx, p, client, rn.rate, d, rn.mk)
		if err != nil {
			// Go on with the other rates; the suite still fails at the end.
			e.logf("   %s: %v", rn.name, err)
			errs = append(errs, fmt.Errorf("%s: %w", rn.name, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		note := fmt.Sprintf("%d events at %s/s (target %d/s) for %s", len(ms), fmtNum(achieved), rn.rate, d)
		if achieved < 0.9*float64(rn.rate) {
			note += "; the producers could not keep the rate"
		}
		var t50, t99 *target
		if rn.rate == 1000 {
			t50, t99 = valueAtMost(10), valueAtMost(50)
		}
		r.add(rn.name+"_p50", single(percentile(ms, 50)), "ms", t50, note)
		r.add(rn.name+"_p95", single(percentile(ms, 95)), "ms", nil, "")
		r.add(rn.name+"_p99", single(percentile(ms, 99)), "ms", t99, "")
		r.add(rn.name+"_max", single(ms[len(ms)-1]), "ms", nil, "")
	}
	return errors.Join(errs...)
}

func rateName(rate int) string {
	if rate >= 1000 {
		return fmt.Sprintf("%dk", rate/1000)
	}
	return fmt.Sprint(rate)
}
