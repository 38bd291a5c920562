package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque"
)

// quietLogger keeps the Go client's logs out of the benchmark's output.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// goProducer drives the Go client's Send and SendBatch.
type goProducer struct {
	client *pgque.Client
	// direct is a client whose Sends are never coalesced
	// (SendConcurrency -1): each is its own send call.
	direct *pgque.Client
	next   atomic.Int64
	batch  []pgque.Event
}

func newGoProducer(ctx context.Context, p *pgqueDB) (*goProducer, error) {
	// The client shares the suite's pool (40 connections), so 16 goroutines
	// each get a connection, as the raw SQL cases do.
	c, err := pgque.NewClient(p.pool, &pgque.Config{Logger: quietLogger, PollOnly: true})
	if err != nil {
		return nil, err
	}
	direct, err := pgque.NewClient(p.pool, &pgque.Config{Logger: quietLogger, PollOnly: true, SendConcurrency: -1})
	if err != nil {
		return nil, err
	}
	g := &goProducer{client: c, direct: direct}
	payloads, keys := batchPayloads(0, batchSize)
	for i := range payloads {
		g.batch = append(g.batch, pgque.Event{Type: eventType, Payload: json.RawMessage(payloads[i]), PartitionKey: keys[i]})
	}
	return g, nil
}

func (g *goProducer) close() {
	g.client.Close()
	g.direct.Close()
}

// sendRate measures Client.Send from workers goroutines; events per second.
func (g *goProducer) sendRate(ctx context.Context, workers int, d time.Duration) (float64, error) {
	return g.sendRateWith(ctx, g.client, workers, d)
}

// sendRateDirect is sendRate without coalescing.
func (g *goProducer) sendRateDirect(ctx context.Context, workers int, d time.Duration) (float64, error) {
	return g.sendRateWith(ctx, g.direct, workers, d)
}

func (g *goProducer) sendRateWith(ctx context.Context, client *pgque.Client, workers int, d time.Duration) (float64, error) {
	return loop(ctx, workers, d, func(ctx context.Context, _ int) (int, error) {
		i := int(g.next.Add(1))
		_, err := client.Send(ctx, pgqueQueue, pgque.Event{Type: eventType,
			Payload: json.RawMessage(payload(i)), PartitionKey: tenantKey(i)})
		return 1, err
	})
}

// sendBatchRate measures Client.SendBatch of batchSize events from one
// goroutine; events per second.
func (g *goProducer) sendBatchRate(ctx context.Context, d time.Duration) (float64, error) {
	return loop(ctx, 1, d, func(ctx context.Context, _ int) (int, error) {
		_, err := g.client.SendBatch(ctx, pgqueQueue, g.batch)
		return batchSize, err
	})
}

// orderCheck records each tenant's last handled event and counts events
// that arrive out of order within their tenant (a G1 violation when no
// handler fails) and duplicates.
type orderCheck struct {
	mu         sync.Mutex
	last       map[string]int
	handled    atomic.Int64
	violations atomic.Int64
	target     int64
	first      atomic.Int64 // UnixNano when the first handler call began
	lastEnd    atomic.Int64 // UnixNano when the latest handler call ended
	done       chan struct{}
	once       sync.Once
	// byID checks order by event id within each partition key instead of
	// decoding the payload's tenant and seq: the same G1 check (every
	// bench event's key is its tenant) without a JSON decode per event.
	byID bool
}

func newOrderCheck(events int) *orderCheck {
	return &orderCheck{last: map[string]int{}, target: int64(events), done: make(chan struct{})}
}

type benchPayload struct {
	Tenant string `json:"tenant"`
	Seq    int    `json:"seq"`
}

// see records one handled message.
func (o *orderCheck) see(m *pgque.Message) error {
	tenant, seq := m.PartitionKey, int(m.ID)
	if !o.byID {
		var p benchPayload
		if err := m.Decode(&p); err != nil {
			return err
		}
		tenant, seq = p.Tenant, p.Seq
	}
	o.mu.Lock()
	prev, ok := o.last[tenant]
	if ok && seq <= prev {
		o.violations.Add(1)
	}
	o.last[tenant] = seq
	o.mu.Unlock()
	if o.handled.Add(1) >= o.target {
		o.once.Do(func() { close(o.done) })
	}
	return nil
}

// wait blocks until every event was handled, ctx ends or timeout passes.
func (o *orderCheck) wait(ctx context.Context, timeout time.Duration) error {
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		return fmt.Errorf("only %d of %d events handled after %s", o.handled.Load(), o.target, timeout)
	}
}

// handler returns a HandlerFunc that records the message and then spends
// cost (sleeping, like a handler waiting on I/O).
func (o *orderCheck) handler(cost time.Duration) pgque.HandlerFunc {
	return func(ctx context.Context, m *pgque.Message) error {
		o.first.CompareAndSwap(0, time.Now().UnixNano())
		if cost > 0 {
			time.Sleep(cost)
		}
		end := time.Now().UnixNano()
		for {
			cur := o.lastEnd.Load()
			if end <= cur || o.lastEnd.CompareAndSwap(cur, end) {
				break
			}
		}
		return o.see(m)
	}
}

// rate returns events per second between the first handler call's start
// and the last one's end: the drain itself, without start-up (subscribing,
// the first claim pass) or shutdown.
func (o *orderCheck) rate() float64 {
	d := time.Duration(o.lastEnd.Load() - o.first.Load())
	if d <= 0 {
		return 0
	}
	return float64(o.handled.Load()) / d.Seconds()
}

// drainTimeout bounds a drain: generous, so only a stuck consumer hits it.
func drainTimeout(events int, cost time.Duration, workers int) time.Duration {
	return 60*time.Second + time.Duration(events)*cost/time.Duration(max(1, workers))*3
}

// partitionedRate builds a backlog of events in a fresh queue whose nslots
// slots are already subscribed, then times a PartitionedConsumer (client
// defaults, Slots nslots) draining it, with a
// handler that costs cost per event. It fails on any per-tenant order
// violation. Events per second.
func (p *pgqueDB) partitionedRate(ctx context.Context, client *pgque.Client, nslots, events int, cost time.Duration) (float64, error) {
	return p.partitionedRateWith(ctx, client, nslots, events, cost, nil)
}

// partitionedRateWith is partitionedRate with the consumer's configuration
// changed by configure (nil: none).
func (p *pgqueDB) partitionedRateWith(ctx context.Context, client *pgque.Client, nslots, events int, cost time.Duration,
	configure func(*pgque.PartitionedConsumerConfig)) (float64, error) {
	q := p.fresh("part")
	oc := newOrderCheck(events)
	cfg := pgque.PartitionedConsumerConfig{Queue: q, Consumer: "workers", Slots: nslots, Handler: oc.handler(cost)}
	if configure != nil {
		configure(&cfg)
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	c := conn.Conn()
	err = func() error {
		defer conn.Release()
		if _, err := c.Exec(ctx, "select pgque.create_queue($1)", q); err != nil {
			return err
		}
		for k := range nslots {
			if _, err := c.Exec(ctx, "select pgque.subscribe_slot($1, 'workers', $2, $3)", q, k, nslots); err != nil {
				return fmt.Errorf("subscribe_slot: %w", err)
			}
		}
		if err := routeIndexes(ctx, c); err != nil {
			return err
		}
		// The consumer refuses slots subscribed under another policy.
		if cfg.FailurePolicy != 0 {
			if _, err := c.Exec(ctx, "select pgque.set_failure_policy($1, 'workers', $2)", q, cfg.FailurePolicy.String()); err != nil {
				return fmt.Errorf("set_failure_policy: %w", err)
			}
		}
		return backlog(ctx, c, q, events)
	}()
	if err != nil {
		return 0, err
	}
	// Key lanes may hold a key whose handler is slow to be scheduled (on a
	// loaded machine), which puts its events back into the log for a later
	// batch: a ticker must run, as it does in production, or they wait
	// forever.
	tk, err := client.NewTicker(&pgque.TickerConfig{WorkerID: "bench-" + q})
	if err != nil {
		return 0, err
	}
	if err := tk.Start(ctx); err != nil {
		return 0, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = tk.Stop(sctx)
	}()
	pc, err := client.NewPartitionedConsumer(&cfg)
	if err != nil {
		return 0, err
	}
	if err := pc.Start(ctx); err != nil {
		return 0, err
	}
	werr := oc.wait(ctx, drainTimeout(events, cost, nslots))
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	serr := pc.Stop(stopCtx)
	if werr != nil {
		return 0, fmt.Errorf("partitioned consumer N=%d: %w", nslots, werr)
	}
	if serr != nil {
		return 0, fmt.Errorf("stopping partitioned consumer: %w", serr)
	}
	if v := oc.violations.Load(); v > 0 {
		return 0, fmt.Errorf("partitioned consumer N=%d delivered %d events out of per-tenant order", nslots, v)
	}
	return oc.rate(), nil
}

// consumerRate is partitionedRate for a plain Consumer (one goroutine,
// client defaults). With decode, the handler decodes every payload (encoding/json) to check
// order by its tenant and seq; without, it checks order by event id within
// each key, doing about what the PgQ reference loop does with a row.
func (p *pgqueDB) consumerRate(ctx context.Context, client *pgque.Client, events int, decode bool) (float64, error) {
	q := p.fresh("plain")
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	c := conn.Conn()
	err = func() error {
		defer conn.Release()
		if _, err := c.Exec(ctx, "select pgque.create_queue($1)", q); err != nil {
			return err
		}
		if _, err := c.Exec(ctx, "select pgque.subscribe($1, 'c')", q); err != nil {
			return err
		}
		return backlog(ctx, c, q, events)
	}()
	if err != nil {
		return 0, err
	}
	oc := newOrderCheck(events)
	oc.byID = !decode
	con, err := client.NewConsumer(&pgque.ConsumerConfig{Queue: q, Consumer: "c", Handler: oc.handler(0)})
	if err != nil {
		return 0, err
	}
	if err := con.Start(ctx); err != nil {
		return 0, err
	}
	werr := oc.wait(ctx, drainTimeout(events, 0, 1))
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	serr := con.Stop(stopCtx)
	if werr != nil {
		return 0, fmt.Errorf("consumer: %w", werr)
	}
	if serr != nil {
		return 0, fmt.Errorf("stopping consumer: %w", serr)
	}
	if v := oc.violations.Load(); v > 0 {
		return 0, fmt.Errorf("consumer delivered %d events out of order", v)
	}
	return oc.rate(), nil
}
