package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque"
)

// Key lanes: a PartitionedConsumer with I/O-like handlers (sleeps), where
// parallelism comes from the number of active keys and MaxWorkers, not
// from N. The cases are run by the consume and peers suites.

// laneRun is one drain of a fresh queue by one PartitionedConsumer.
type laneRun struct {
	slots, events, tenants int
	cost                   time.Duration
	// maxWorkers and perSlot set MaxWorkers and MaxWorkersPerSlot (0:
	// the defaults; perSlot 1: lanes off, one event at a time per slot).
	maxWorkers, perSlot int
	// hotEvery > 0 sends every hotEvery-th event to the key "hot", whose
	// handler costs hotCost; the run then times only the other keys and
	// does not wait for the hot key. dropHot leaves those events out (the
	// reference run: the same other events in the same batches).
	hotEvery int
	hotCost  time.Duration
	dropHot  bool
}

// ideal is the drain rate the run could reach at best: min(active keys,
// running-handler limit) handlers at once, but no faster than its busiest
// key, which runs one event at a time (hot key excluded).
func (lr laneRun) ideal() float64 {
	limit := lr.maxWorkers
	if limit == 0 {
		limit = pgque.MaxWorkersDefault
	}
	if lr.perSlot == 1 {
		limit = lr.slots
	}
	events := lr.events
	if lr.hotEvery > 0 {
		events -= lr.events / lr.hotEvery
	}
	parallel := min(lr.tenants, limit)
	busiest := (events + lr.tenants - 1) / lr.tenants
	d := max(float64(events)*lr.cost.Seconds()/float64(parallel), float64(busiest)*lr.cost.Seconds())
	if d == 0 {
		return 0
	}
	return float64(events) / d
}

// laneCheck times the run and checks per-key order (sequence numbers per
// key, one handler per key at a time).
type laneCheck struct {
	target   int64
	handled  atomic.Int64
	bad      atomic.Int64
	first    atomic.Int64
	lastEnd  atomic.Int64
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	last     map[int]int
	inFlight map[int]bool
}

type lanePayload struct {
	T int `json:"t"` // key index; -1 is the hot key
	S int `json:"s"` // sequence within the key
}

func (c *laneCheck) handler(cost, hotCost time.Duration) pgque.HandlerFunc {
	return func(ctx context.Context, m *pgque.Message) error {
		var p lanePayload
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return err
		}
		c.mu.Lock()
		if c.inFlight[p.T] || (c.last[p.T] != 0 && p.S <= c.last[p.T]) {
			c.bad.Add(1)
		}
		c.inFlight[p.T] = true
		c.last[p.T] = p.S
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.inFlight[p.T] = false
			c.mu.Unlock()
		}()
		if p.T < 0 {
			select {
			case <-time.After(hotCost):
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}
		c.first.CompareAndSwap(0, time.Now().UnixNano())
		if cost > 0 {
			time.Sleep(cost)
		}
		end := time.Now().UnixNano()
		for cur := c.lastEnd.Load(); end > cur && !c.lastEnd.CompareAndSwap(cur, end); cur = c.lastEnd.Load() {
		}
		if c.handled.Add(1) >= c.target {
			c.once.Do(func() { close(c.done) })
		}
		return nil
	}
}

// laneRate runs lr and returns the other keys' (all but "hot") events per
// second, first handler call to last. It fails on a per-key order or
// overlap violation.
func (p *pgqueDB) laneRate(ctx context.Context, client *pgque.Client, lr laneRun) (float64, error) {
	q, others, err := p.loadLanes(ctx, lr)
	if err != nil {
		return 0, err
	}
	stopTicker, err := startTicker(ctx, client, q)
	if err != nil {
		return 0, err
	}
	defer stopTicker()
	chk := &laneCheck{target: int64(others), done: make(chan struct{}), last: map[int]int{}, inFlight: map[int]bool{}}
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: q, Consumer: "workers", Slots: lr.slots, MaxWorkers: lr.maxWorkers, MaxWorkersPerSlot: lr.perSlot,
		Handler: chk.handler(lr.cost, lr.hotCost),
	})
	if err != nil {
		return 0, err
	}
	if err := pc.Start(ctx); err != nil {
		return 0, err
	}
	var werr error
	select {
	case <-chk.done:
	case <-ctx.Done():
		werr = ctx.Err()
	case <-time.After(drainTimeout(others, lr.cost, max(lr.slots, lr.maxWorkers))):
		werr = fmt.Errorf("only %d of %d events handled", chk.handled.Load(), others)
	}
	// With a hot key its lane may still have a long way to go: abandon it
	// (the queue is not used again).
	hasHot := lr.hotEvery > 0 && !lr.dropHot
	stopTimeout := 30 * time.Second
	if hasHot {
		stopTimeout = time.Second
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	serr := pc.Stop(stopCtx)
	if werr != nil {
		return 0, fmt.Errorf("lanes %+v: %w", lr, werr)
	}
	if serr != nil && !hasHot {
		return 0, fmt.Errorf("stopping partitioned consumer: %w", serr)
	}
	if v := chk.bad.Load(); v > 0 {
		return 0, fmt.Errorf("lanes %+v: %d events out of per-key order or overlapping their key", lr, v)
	}
	d := time.Duration(chk.lastEnd.Load() - chk.first.Load())
	if d <= 0 {
		return 0, nil
	}
	return float64(chk.handled.Load()) / d.Seconds(), nil
}

// loadLanes creates a fresh queue, subscribes lr.slots slots of consumer
// "workers" and loads lr's backlog (lanePayload events, ticked per
// batchSize). It returns the queue and the number of events of keys other
// than "hot".
func (p *pgqueDB) loadLanes(ctx context.Context, lr laneRun) (string, int, error) {
	q := p.fresh("lanes")
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return "", 0, err
	}
	defer conn.Release()
	c := conn.Conn()
	others := 0
	if _, err := c.Exec(ctx, "select pgque.create_queue($1)", q); err != nil {
		return "", 0, err
	}
	for k := range lr.slots {
		if _, err := c.Exec(ctx, "select pgque.subscribe_slot($1, 'workers', $2, $3)", q, k, lr.slots); err != nil {
			return "", 0, fmt.Errorf("subscribe_slot: %w", err)
		}
	}
	if err := routeIndexes(ctx, c); err != nil {
		return "", 0, err
	}
	seq := map[int]int{}
	for from := 0; from < lr.events; from += batchSize {
		var payloads, keys []string
		for i := from; i < min(from+batchSize, lr.events); i++ {
			t, key := i%lr.tenants, "tenant-"+strconv.Itoa(i%lr.tenants)
			if lr.hotEvery > 0 && i%lr.hotEvery == 0 {
				if lr.dropHot {
					continue
				}
				t, key = -1, "hot"
			} else {
				others++
			}
			seq[t]++
			b, _ := json.Marshal(lanePayload{T: t, S: seq[t]})
			payloads, keys = append(payloads, string(b)), append(keys, key)
		}
		if _, err := c.Exec(ctx, `select pgque.send_batch($1, $2, $3::jsonb[], $4::text[])`, q, eventType, payloads, keys); err != nil {
			return "", 0, fmt.Errorf("send_batch: %w", err)
		}
		if err := tick(ctx, c, q); err != nil {
			return "", 0, err
		}
	}
	return q, others, nil
}

// startTicker starts a Go Ticker for the drain of queue q: holds put a
// slow key's events back into the log, for a later batch, so a ticker must
// run, as it does in production. The returned function stops it.
func startTicker(ctx context.Context, client *pgque.Client, q string) (func(), error) {
	tk, err := client.NewTicker(&pgque.TickerConfig{WorkerID: "bench-" + q})
	if err != nil {
		return nil, err
	}
	if err := tk.Start(ctx); err != nil {
		return nil, err
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = tk.Stop(sctx)
	}, nil
}

// laneTenants is the tenant count of the lane cases: the 200.
const laneTenants = 200

// runLaneCases measures key lanes at a 20 ms and a 0 ms handler and with
// a hot key, side by side with lanes off (one event at a time per slot).
func runLaneCases(ctx context.Context, e *env, r *recorder, p *pgqueDB, client *pgque.Client) error {
	const slots = 16
	ev20 := pick(e, 4000, 20000)
	runs := map[string]laneRun{
		"lanes_off": {slots: slots, events: ev20, tenants: laneTenants, cost: 20 * time.Millisecond, perSlot: 1},
		"default":   {slots: slots, events: ev20, tenants: laneTenants, cost: 20 * time.Millisecond},
		"mw100":     {slots: slots, events: ev20, tenants: laneTenants, cost: 20 * time.Millisecond, maxWorkers: 100},
	}
	if e.quick {
		// lanes off at 20 ms is slow (about 16 × 50 ev/s): fewer events.
		lo := runs["lanes_off"]
		lo.events = pick(e, 2000, 2000)
		runs["lanes_off"] = lo
	}
	var trials []trial
	for _, name := range []string{"lanes_off", "default", "mw100"} {
		lr := runs[name]
		trials = append(trials, trial{name, func(ctx context.Context) (float64, error) { return p.laneRate(ctx, client, lr) }})
	}
	m, err := e.rounds(ctx, pick(e, 1, 2), trials...)
	if err != nil {
		return err
	}
	for _, name := range []string{"default", "mw100"} {
		lr := runs[name]
		ideal := lr.ideal()
		cse := "lanes_" + name + "_N16_cost20ms"
		note := fmt.Sprintf("%d events of %d tenants, 16 slots, MaxWorkers %s; ideal %s ev/s (min(keys, limit) / 20 ms, bounded by the busiest key): %.0f%% of it",
			lr.events, lr.tenants, orDefault(lr.maxWorkers), fmtNum(ideal), 100*m[name].value/ideal)
		r.compare(cse, m[name], "lanes_off_N16_cost20ms", m["lanes_off"], "events/s", nil, note)
		r.add(cse+"_vs_ideal", measurement{value: m[name].value / ideal}, "ratio", valueAtLeast(0.7), note)
	}
	r.add("lanes_off_N16_cost20ms", m["lanes_off"], "events/s", nil,
		fmt.Sprintf("%d events of %d tenants, 16 slots, MaxWorkersPerSlot 1 (one event at a time per slot, as before lanes)", runs["lanes_off"].events, laneTenants))

	// Handler 0 ms: lanes must not tax the fast path.
	// A quick drain of 20 000 took about 0.2 s, in which one scheduling
	// hiccup of either side moved the ratio by a quarter: 60 000 and a
	// fifth round keep a quick run's median within a few percent.
	ev0 := pick(e, 60000, 100000)
	fast := map[string]laneRun{
		"off0": {slots: slots, events: ev0, tenants: 1000, perSlot: 1},
		"on0":  {slots: slots, events: ev0, tenants: 1000},
	}
	var ftrials []trial
	for _, name := range []string{"off0", "on0"} {
		lr := fast[name]
		ftrials = append(ftrials, trial{name, func(ctx context.Context) (float64, error) { return p.laneRate(ctx, client, lr) }})
	}
	// A drain takes about a second: on a shared machine one round of
	// either side may land on a busy moment, so take the median of more.
	fm, err := e.rounds(ctx, pick(e, 5, 5), ftrials...)
	if err != nil {
		return err
	}
	r.compare("lanes_default_N16_cost0", fm["on0"], "lanes_off_N16_cost0", fm["off0"], "events/s", atLeast(0.9),
		fmt.Sprintf("%d events of 1000 tenants, 16 slots, handler cost 0: lanes (defaults) vs MaxWorkersPerSlot 1", ev0))

	// One hot key, the others at 5 ms. The reference run sends the same
	// other events in the same batches, without the hot key's. A quick run
	// still drains for about two seconds: a hold's few writes must not be
	// most of the figure. slow: 10% of the events, 200 ms each (each of its
	// handlers outlasts HoldAfter). fast: a quarter of the events, 5 ms each
	// like the others, so that no handler is slow: its lane is held once its
	// events left would take ten hold times (500 ms). Each hold still costs
	// the other keys of its slot a chunk's wait in a drain of about a
	// second without the hot key: hence the lower target (0.02x when such
	// a key was never held, 0.66-0.73x now).
	evHot := pick(e, 20000, 40000)
	for _, v := range []struct {
		cse, about string
		every      int
		cost       time.Duration
		min        float64
	}{
		{"lanes_hot_key_others", "every 10th event at 200 ms", 10, 200 * time.Millisecond, 0.8},
		{"lanes_fast_hot_key_others", "every 4th event at 5 ms", 4, 5 * time.Millisecond, 0.5},
	} {
		hot := laneRun{slots: slots, events: evHot, tenants: laneTenants - 1, cost: 5 * time.Millisecond, hotEvery: v.every, hotCost: v.cost}
		cold := hot
		cold.dropHot = true
		hm, err := e.rounds(ctx, pick(e, 2, 3),
			trial{"hot", func(ctx context.Context) (float64, error) { return p.laneRate(ctx, client, hot) }},
			trial{"cold", func(ctx context.Context) (float64, error) { return p.laneRate(ctx, client, cold) }},
		)
		if err != nil {
			return err
		}
		r.compare(v.cse, hm["hot"], strings.Replace(v.cse, "hot_key_others", "no_hot_key", 1), hm["cold"], "events/s", atLeast(v.min),
			fmt.Sprintf("%d events: one key with %s, %d other keys at 5 ms; the other keys' rate (first call to last) vs the same other events in the same batches without the hot key's, 16 slots, defaults", evHot, v.about, laneTenants-1))
	}
	return nil
}

func orDefault(n int) string {
	if n == 0 {
		return fmt.Sprintf("%d (default)", pgque.MaxWorkersDefault)
	}
	return strconv.Itoa(n)
}
