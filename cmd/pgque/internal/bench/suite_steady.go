package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/workerpool"
)

// Steady load: what the server spends per event when producers send at a
// fixed, ordinary rate rather than as fast as they can. Producers call
// Client.Send at 100, 500 or 2 000 keyed events a second (1 000 keys, a
// fifth of the events on 3 hot keys); the Go Ticker runs with its defaults
// (10 ms ticks; --tick-lag sets the queues' ticker_max_lag instead, to
// measure fewer ticks against more latency); a consumer of 1, 4 or 16 slots takes the events, either
// the Go PartitionedConsumer ("go"; in full mode at 16 slots also with
// GatherReceives, "gogather") or one plain SQL loop per slot ("sql")
// that wakes on each touched set naming its slot and calls
// receive_partitioned_raw with the folded ack until a chunk ends its
// batch (see sqlSlotLoop), as a client without the Go library would. Each configuration runs once without and once with
// a REPEATABLE READ transaction held open on another connection. Each rate
// also runs once with a 16-slot consumer subscribed
// that never receives ("none"): what the producers, the ticker and the
// server's background processes cost per event before any consumer work,
// the floor under every consumer's figures.
//
// Over the measured window (the producers' run plus the drain of what they
// sent) it reports, per event: the server time of the receive and ack
// statements (pg_stat_statements, top-level, so a function's inner
// statements are inside its caller's time), the calls and buffer accesses
// of those statements, the CPU time of the consumer's backends and of every
// server process (utime+stime from /proc), the WAL the cluster wrote, and
// the delivery latency from Send to the handler (p50, p99).
//
// With --upstream-sql (steady_upstream.go) the same configurations of the
// SQL loop run against upstream PgQue afterwards; the output then ends
// with each figure of upstream beside pgque's and their ratio.
//
// The drain suite uses the same systems, loops and figures: the SQL loops
// of a 16-slot consumer drain a backlog (see drain), cold and warm, in
// pgque and, with --upstream-sql, in upstream PgQue.

func init() {
	register(&suite{
		name:    "steady",
		about:   "server time, CPU, calls, buffers and WAL per event, and latency, at 100/500/2000 ev/s, 1/4/16 slots, Go pool and SQL loop, with and without a held horizon",
		run:     runSteady,
		preload: []string{pgssLibrary},
	})
	register(&suite{
		name:    "drain",
		about:   "16 SQL loops draining a backlog of keyed events, cold and warm: events/s and the steady suite's server figures (with --upstream-sql beside upstream PgQue's)",
		run:     runDrain,
		preload: []string{pgssLibrary},
	})
}

// Application names of the steady suite's connections.
const (
	steadyAppConsumer = "pgque-bench-consumer"
	steadyAppProducer = "pgque-bench-producer"
	steadyAppTicker   = "pgque-bench-ticker"
)

var steadyGroups = map[string]string{
	steadyAppConsumer: "consumer",
	steadyAppProducer: "producer",
	steadyAppTicker:   "ticker",
}

// steadyConfig is one measured configuration.
type steadyConfig struct {
	rate   int
	slots  int
	client string // "go", "gogather" (GatherReceives), "ts" (the TypeScript worker), "tsgather" (with gatherReceives), "sql" or "none" (subscribed, never receives)
	held   bool
	drain  bool // a backlog drained as fast as it goes, not a rate
	warm   bool // the drain's loops warmed up on a first backlog before it
	// handle is how long the Go pool's handler takes per event
	// (Options.HandlerTime; the Go and TypeScript clients only).
	handle time.Duration
	// tick is the ticker_max_lag of the queue (Options.TickLag; pgque's
	// queues only, 0: the default).
	tick time.Duration
}

func (c steadyConfig) name() string {
	if c.drain && c.warm {
		return fmt.Sprintf("drain_s%d_%s_warm", c.slots, c.client)
	}
	if c.drain {
		return fmt.Sprintf("drain_s%d_%s", c.slots, c.client)
	}
	h := "free"
	if c.held {
		h = "held"
	}
	if c.handle > 0 {
		h += fmt.Sprintf("_h%gms", float64(c.handle)/float64(time.Millisecond))
	}
	if c.tick > 0 {
		h += fmt.Sprintf("_t%gms", float64(c.tick)/float64(time.Millisecond))
	}
	return fmt.Sprintf("r%s_s%d_%s_%s", rateName(c.rate), c.slots, c.client, h)
}

// steadyConfigs lists the configurations of the mode.
func steadyConfigs(e *env) []steadyConfig {
	rates, slots, clients, held := []int{100, 500, 2000}, []int{1, 4, 16}, []string{"go", "sql"}, []bool{false, true}
	switch {
	case e.tiny:
		rates, slots, held = []int{500}, []int{4}, []bool{false}
	case e.quick:
		rates, slots = []int{500}, []int{1, 16}
	}
	var out []steadyConfig
	add := func(c steadyConfig) {
		c.tick = e.tickLag
		if e.only == nil || e.only.MatchString(c.name()) {
			out = append(out, c)
		}
	}
	for _, r := range rates {
		add(steadyConfig{rate: r, slots: 16, client: "none"})
		for _, s := range slots {
			for _, h := range held {
				for _, c := range clients {
					add(steadyConfig{rate: r, slots: s, client: c, held: h, handle: goHandle(c, e.handlerTime)})
				}
				// The Go pool with GatherReceives, in full mode: what one
				// call for the slots a tick wakes saves, and costs.
				// And the TypeScript worker (work()), what a Node.js
				// service runs, without and with gatherReceives.
				if s == 16 && !e.quick {
					add(steadyConfig{rate: r, slots: s, client: "gogather", held: h, handle: e.handlerTime})
					add(steadyConfig{rate: r, slots: s, client: "ts", held: h, handle: e.handlerTime})
					add(steadyConfig{rate: r, slots: s, client: "tsgather", held: h, handle: e.handlerTime})
				}
				// The package's tests run the TypeScript worker too, so
				// that its driver is exercised wherever they run.
				if e.tiny {
					add(steadyConfig{rate: r, slots: s, client: "ts", held: h, handle: e.handlerTime})
				}
			}
		}
	}
	return out
}

// goHandle is the handler time of a configuration of client: d for the Go
// and TypeScript clients, none for the others.
func goHandle(client string, d time.Duration) time.Duration {
	if client == "go" || client == "gogather" || client == "ts" || client == "tsgather" {
		return d
	}
	return 0
}

// steadyKey returns the partition key of event i: a fifth of the events
// go to three hot keys, the rest spread over the tenants.
func steadyKey(i int) string {
	if i%5 == 0 {
		return "hot-" + strconv.Itoa((i/5)%3)
	}
	return tenantKey(i)
}

// steadyResult is what one configuration measured.
type steadyResult struct {
	system   string // "pgque" or "upstream"
	cfg      steadyConfig
	events   int
	achieved float64 // events/s the producers reached (the drain: events/s delivered)
	took     time.Duration
	pgss     map[string]pgssStat // nil without pg_stat_statements
	cpu      map[string]float64  // CPU seconds by group; nil without /proc
	walBytes int64
	ticks    int64     // ticks the ticker made in the window
	load     string    // the machine's 1-minute load average at the end
	ms       []float64 // sorted delivery latencies
}

func (r steadyResult) per(v float64) float64 { return v / float64(max(r.events, 1)) }

// caseName is the result's name in the report: upstream's carry the
// prefix "upstream_".
func (r steadyResult) caseName() string {
	if r.system == "upstream" {
		return "upstream_" + r.cfg.name()
	}
	return r.cfg.name()
}

// steadySide is one system the suite measures in its own database: pgque,
// or upstream PgQue with --upstream-sql.
type steadySide struct {
	e      *env
	system string
	dsn    string // of the system's database, for the held transaction
	probe  *pgx.Conn
	pgss   *pgssProbe
	proc   *procProbe
	// newQueue creates a fresh queue for cfg (with its tick lag, on
	// pgque's side).
	newQueue func(ctx context.Context, cfg steadyConfig) (string, error)
	// send sends event i with body to q, keyed steadyKey(i).
	send func(ctx context.Context, q string, i int, body []byte) error
	// sqlConsumer subscribes an N-slot consumer of q and returns the
	// function that starts its SQL loops; a loop waits at gate (when not
	// nil) before each receive.
	sqlConsumer func(ctx context.Context, q string, slots int, lat *latencyLog) (func(context.Context, *loopGate) (steadyConsumer, error), error)
	// goConsumer starts the Go PartitionedConsumer; nil for upstream.
	goConsumer func(ctx context.Context, q string, cfg steadyConfig, lat *latencyLog) (steadyConsumer, error)
	// tsConsumer starts the TypeScript worker; nil for upstream. An error
	// wrapping errSkipped (no Node.js, the package cannot be built) skips
	// the configuration.
	tsConsumer func(ctx context.Context, q string, cfg steadyConfig, lat *latencyLog) (steadyConsumer, error)
	// lastTick returns the last tick id of q.
	lastTick func(ctx context.Context, q string) (int64, error)
	// closeBacklog makes sure the events sent to q are in a tick.
	closeBacklog func(ctx context.Context, q string) error
	closers      []func()
}

func (s *steadySide) stop() {
	for _, f := range slices.Backward(s.closers) {
		f()
	}
	s.closers = nil
}

// steadyParts says what runSteadyParts measures: the configurations at a
// steady rate, the drains, or both.
type steadyParts struct{ configs, drains bool }

// runSteady measures every configuration at its steady rate (beside
// upstream's with --upstream-sql).
func runSteady(ctx context.Context, e *env, r *recorder) error {
	return runSteadyParts(ctx, e, r, steadyParts{configs: true})
}

// runDrain measures the drains (beside upstream's with --upstream-sql)
// with the steady suite's systems, loops and figures.
func runDrain(ctx context.Context, e *env, r *recorder) error {
	return runSteadyParts(ctx, e, r, steadyParts{drains: true})
}

func runSteadyParts(ctx context.Context, e *env, r *recorder, parts steadyParts) error {
	d := pick(e, 3*time.Second, 20*time.Second)
	drainEvents := pick(e, 20000, 100000)
	systems := []func(context.Context, *env) (*steadySide, error){newPgqueSide}
	if e.tickLag > 0 && parts.configs {
		e.logf("   pgque's queues tick with ticker_max_lag %s (the default is 10ms); p50/p99 have no target", e.tickLag)
	}
	if e.upstream != nil {
		e.logf("   upstream PgQue from %s", e.upstream.describe())
		systems = append(systems, newUpstreamSide)
	}
	var results []steadyResult
	for _, newSide := range systems {
		side, err := newSide(ctx, e)
		if err != nil {
			return err
		}
		err = side.runAll(ctx, r, parts, d, drainEvents, &results)
		side.stop()
		if err != nil {
			return err
		}
	}
	steadyTable(e, results)
	if e.upstream != nil {
		steadyCompare(e, r, results)
	}
	return nil
}

// runAll measures on side the configurations of the mode, the drains, or
// both.
func (side *steadySide) runAll(ctx context.Context, r *recorder, parts steadyParts, d time.Duration, drainEvents int, results *[]steadyResult) error {
	for _, cfg := range steadyConfigs(side.e) {
		// The floor ("none") is pgque's alone: upstream's is not needed to
		// compare with it, and upstream's 16-slot loops that ran after one
		// made about a hundred times the calls (docs/benchmarks.md, "The
		// floor under the consumer").
		if !parts.configs || ((cfg.client == "go" || cfg.client == "gogather") && side.goConsumer == nil) ||
			((cfg.client == "ts" || cfg.client == "tsgather") && side.tsConsumer == nil) || (cfg.client == "none" && side.system != "pgque") {
			continue
		}
		if side.system != "pgque" {
			cfg.tick = 0 // upstream keeps its own schedule
		}
		res, err := side.run(ctx, cfg, d)
		if errors.Is(err, errSkipped) {
			side.e.logf("   %-8s %-22s skipped: %v", side.system, cfg.name(), err)
			continue
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", side.system, cfg.name(), err)
		}
		*results = append(*results, res)
		recordSteady(r, res)
	}
	if !parts.drains {
		return nil
	}
	for _, warm := range []bool{false, true} {
		cfg := steadyConfig{slots: 16, client: "sql", drain: true, warm: warm}
		res, err := side.drain(ctx, cfg, drainEvents)
		if err != nil {
			return fmt.Errorf("%s %s: %w", side.system, cfg.name(), err)
		}
		*results = append(*results, res)
		recordSteady(r, res)
	}
	return nil
}

// newSteadySide returns the side of system in database dsn with its
// probes.
func newSteadySide(ctx context.Context, e *env, system, dsn string) (*steadySide, error) {
	side := &steadySide{e: e, system: system, dsn: dsn}
	if err := side.newProbes(ctx); err != nil {
		side.stop()
		return nil, err
	}
	return side, nil
}

// newProbes connects the side's probe to its database and sets up the
// pg_stat_statements and /proc probes on it.
func (side *steadySide) newProbes(ctx context.Context) error {
	var err error
	side.probe, err = pgx.Connect(ctx, side.dsn)
	if err != nil {
		return err
	}
	probe := side.probe
	side.closers = append(side.closers, func() { probe.Close(context.WithoutCancel(ctx)) })
	pgss, why, err := newPgssProbe(ctx, side.probe)
	if err != nil {
		return err
	}
	if pgss == nil {
		side.e.logf("   no server-time, calls or buffer figures: %s", why)
	}
	side.pgss = pgss
	proc, why := newProcProbe(ctx, side.probe)
	if proc == nil {
		side.e.logf("   no CPU figures: %s", why)
	}
	side.proc = proc
	return nil
}

// newPgqueSide sets up pgque: its database, the Go Ticker with its
// defaults, the producers' client and the probes.
func newPgqueSide(ctx context.Context, e *env) (*steadySide, error) {
	p, err := newPgque(ctx, e, "bench_steady", 8)
	if err != nil {
		return nil, err
	}
	side, err := newSteadySide(ctx, e, "pgque", p.dsn)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*steadySide, error) { side.stop(); return nil, err }
	tickPool, err := namedPool(ctx, e, p.dsn, steadyAppTicker, 4)
	if err != nil {
		return fail(err)
	}
	tickClient, err := pgque.NewClient(tickPool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return fail(err)
	}
	side.closers = append(side.closers, tickPool.Close, tickClient.Close)
	ticker, err := tickClient.NewTicker(nil)
	if err != nil {
		return fail(err)
	}
	if err := ticker.Start(ctx); err != nil {
		return fail(err)
	}
	side.closers = append(side.closers, func() { _ = ticker.Stop(context.WithoutCancel(ctx)) })
	if !waitFor(ctx, 30*time.Second, ticker.IsLeader) {
		return fail(fmt.Errorf("the ticker did not become leader within 30s"))
	}

	prodPool, err := namedPool(ctx, e, p.dsn, steadyAppProducer, 16)
	if err != nil {
		return fail(err)
	}
	producer, err := pgque.NewClient(prodPool, &pgque.Config{Logger: quietLogger, PollOnly: true})
	if err != nil {
		return fail(err)
	}
	side.closers = append(side.closers, prodPool.Close, producer.Close)
	consDSN := withAppName(p.dsn, steadyAppConsumer)
	var consPool *pgxpool.Pool

	side.newQueue = func(ctx context.Context, cfg steadyConfig) (string, error) {
		q := p.fresh("steady")
		if _, err := producer.CreateQueue(ctx, q); err != nil || cfg.tick == 0 {
			return q, err
		}
		return q, producer.SetQueueConfig(ctx, q, pgque.QueueTickerMaxLag(cfg.tick))
	}
	side.send = func(ctx context.Context, q string, i int, body []byte) error {
		_, err := producer.Send(ctx, q, pgque.Event{Type: eventType, Payload: json.RawMessage(body), PartitionKey: steadyKey(i)})
		return err
	}
	side.sqlConsumer = func(ctx context.Context, q string, slots int, lat *latencyLog) (func(context.Context, *loopGate) (steadyConsumer, error), error) {
		c, err := pgx.Connect(ctx, consDSN)
		if err != nil {
			return nil, err
		}
		defer c.Close(context.WithoutCancel(ctx))
		tokens, err := subscribeSlots(ctx, c, q, "c", slots, "sql-loop")
		if err != nil {
			return nil, err
		}
		tag := workerpool.TickTag(q)
		return func(ctx context.Context, gate *loopGate) (steadyConsumer, error) {
			return startSlotLoops(ctx, consDSN, slots, workerpool.SlotsChannel, func(ctx context.Context, c *pgx.Conn, k int) error {
				return sqlSlotLoop(ctx, c, q, k, slots, tokens[k], tag, lat, gate)
			})
		}, nil
	}
	side.goConsumer = func(ctx context.Context, q string, cfg steadyConfig, lat *latencyLog) (steadyConsumer, error) {
		if consPool == nil {
			if consPool, err = e.pool(ctx, consDSN, 40); err != nil {
				return nil, err
			}
			side.closers = append(side.closers, consPool.Close)
		}
		return startGo(ctx, consPool, q, cfg, lat)
	}
	var ts *tsDriver
	side.tsConsumer = func(ctx context.Context, q string, cfg steadyConfig, lat *latencyLog) (steadyConsumer, error) {
		if ts == nil {
			d, err := setupTS(ctx, e)
			if err != nil {
				return nil, err
			}
			ts = d
		}
		c, err := pgx.Connect(ctx, p.dsn)
		if err != nil {
			return nil, err
		}
		defer c.Close(context.WithoutCancel(ctx))
		for k := range cfg.slots {
			if _, err := c.Exec(ctx, "select pgque.subscribe_slot($1, 'c', $2, $3)", q, k, cfg.slots); err != nil {
				return nil, fmt.Errorf("subscribe_slot %d/%d: %w", k, cfg.slots, err)
			}
		}
		if err := routeIndexes(ctx, c); err != nil {
			return nil, err
		}
		return startTSSteady(ctx, ts, p.dsn, q, cfg, lat)
	}
	side.lastTick = func(ctx context.Context, _ string) (int64, error) { return lastTick(ctx, side.probe) }
	side.closeBacklog = func(ctx context.Context, q string) error { return tick(ctx, side.probe, q) }
	return side, nil
}

// steadyConsumer is a running consumer of one configuration.
type steadyConsumer interface {
	stop(ctx context.Context) error
}

// latencyLog collects delivery latencies by payload sequence number (a
// redelivery counts once).
type latencyLog struct {
	mu   sync.Mutex
	ms   []float64
	seen map[int]bool
	n    atomic.Int64
}

func (l *latencyLog) record(payload []byte, now time.Time) error {
	var p timedPayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return fmt.Errorf("payload %q: %w", payload, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.seen[p.Seq] {
		l.seen[p.Seq] = true
		l.ms = append(l.ms, float64(now.UnixNano()-p.SentNS)/1e6)
		l.n.Add(1)
	}
	return nil
}

// recordMs records the latency of event seq, measured elsewhere (the
// TypeScript worker's handler), as record does.
func (l *latencyLog) recordMs(seq int, ms float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.seen[seq] {
		l.seen[seq] = true
		l.ms = append(l.ms, ms)
		l.n.Add(1)
	}
}

// restart forgets the latencies and the count recorded so far (the events
// already seen stay seen).
func (l *latencyLog) restart() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ms = nil
	l.n.Store(0)
}

// steadyWarmSeq is the first sequence number of a warm-up's events, past
// any measured window's.
const steadyWarmSeq = 1 << 30

// waitDelivered waits while events keep arriving until n were delivered;
// 30 s without progress means delivery is stuck.
func (l *latencyLog) waitDelivered(ctx context.Context, n int) error {
	last, lastChange := l.n.Load(), time.Now()
	for h := last; h < int64(n); h = l.n.Load() {
		if h != last {
			last, lastChange = h, time.Now()
		}
		if time.Since(lastChange) > 30*time.Second {
			return fmt.Errorf("%d of %d events delivered, none for 30 s", h, n)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// sendBody is the payload of event i: its sequence number and send time.
func sendBody(i int) []byte {
	b, _ := json.Marshal(timedPayload{Tenant: steadyKey(i), Seq: i, SentNS: time.Now().UnixNano()})
	return b
}

// run measures one configuration on a fresh queue.
func (side *steadySide) run(ctx context.Context, cfg steadyConfig, d time.Duration) (steadyResult, error) {
	res := steadyResult{system: side.system, cfg: cfg}
	q, err := side.newQueue(ctx, cfg)
	if err != nil {
		return res, err
	}
	lat := &latencyLog{seen: map[int]bool{}}
	var con steadyConsumer
	switch cfg.client {
	case "go", "gogather":
		con, err = side.goConsumer(ctx, q, cfg, lat)
	case "ts", "tsgather":
		con, err = side.tsConsumer(ctx, q, cfg, lat)
	case "none":
		// Subscribed, so that the ticker's hooks do their work for the
		// slot group, but no loop is started.
		_, err = side.sqlConsumer(ctx, q, cfg.slots, lat)
		con = noConsumer{}
	default:
		var start func(context.Context, *loopGate) (steadyConsumer, error)
		if start, err = side.sqlConsumer(ctx, q, cfg.slots, lat); err == nil {
			con, err = start(ctx, nil)
		}
	}
	if err != nil {
		return res, err
	}
	defer func() { _ = con.stop(context.WithoutCancel(ctx)) }()

	if cfg.held {
		release, err := holdHorizon(ctx, side.dsn)
		if err != nil {
			return res, err
		}
		defer release()
	}

	// Warm-up, unmeasured: the consumer's sessions start cold (a new
	// queue's reader is planned once per session, and PostgreSQL plans the
	// first five executions of each statement for their values), which
	// would otherwise be a large part of a short window at 16 slots.
	warm := int(float64(cfg.rate) * d.Seconds() / 3)
	if _, _, err := paced(ctx, cfg.rate, warm, 16, func(ctx context.Context, i int) error {
		return side.send(ctx, q, steadyWarmSeq+i, sendBody(steadyWarmSeq+i))
	}); err != nil {
		return res, fmt.Errorf("producer, warming up: %w", err)
	}
	if err := side.delivered(ctx, cfg, q, lat, warm); err != nil {
		return res, fmt.Errorf("warming up: %w", err)
	}
	lat.restart()

	m0, err := side.begin(ctx, q)
	if err != nil {
		return res, err
	}
	total := int(float64(cfg.rate) * d.Seconds())
	sent, took, err := paced(ctx, cfg.rate, total, 16, func(ctx context.Context, i int) error {
		return side.send(ctx, q, i, sendBody(i))
	})
	if err != nil {
		return res, fmt.Errorf("producer: %w", err)
	}
	if err := side.delivered(ctx, cfg, q, lat, sent); err != nil {
		return res, err
	}
	if err := side.end(ctx, q, m0, &res); err != nil {
		return res, err
	}
	res.events, res.took, res.achieved = sent, took, float64(sent)/took.Seconds()
	lat.mu.Lock()
	res.ms = slices.Clone(lat.ms)
	lat.mu.Unlock()
	slices.Sort(res.ms)
	if err := con.stop(ctx); err != nil {
		return res, fmt.Errorf("stopping the consumer: %w", err)
	}
	side.e.logf("   %-8s %-22s %s", side.system, cfg.name(), res.line())
	return res, nil
}

// delivered waits until n events were delivered or, when nothing
// consumes (client "none"), until the events sent are in a tick.
func (side *steadySide) delivered(ctx context.Context, cfg steadyConfig, q string, lat *latencyLog, n int) error {
	if cfg.client == "none" {
		return side.closeBacklog(ctx, q)
	}
	return lat.waitDelivered(ctx, n)
}

// noConsumer is the consumer of client "none": nothing runs.
type noConsumer struct{}

func (noConsumer) stop(context.Context) error { return nil }

// drain measures cfg.slots SQL loops draining a backlog of events keyed
// sends, which the system's ticker cut into ticks as they arrived (and a
// last forced tick closed): events/s from the loops' start to the last
// delivery, and the server's figures over that window. Cold (cfg.warm
// false), the window includes the loops' connections and their sessions'
// first calls, as for a consumer that starts behind; warm, the loops
// first drain a smaller backlog (a tenth), then wait at a gate while the
// measured one is built, as for a running consumer that falls behind.
func (side *steadySide) drain(ctx context.Context, cfg steadyConfig, events int) (steadyResult, error) {
	res := steadyResult{system: side.system, cfg: cfg}
	q, err := side.newQueue(ctx, cfg)
	if err != nil {
		return res, err
	}
	lat := &latencyLog{seen: map[int]bool{}}
	start, err := side.sqlConsumer(ctx, q, cfg.slots, lat)
	if err != nil {
		return res, err
	}
	backlog := func(from, to int) error {
		if _, _, err := paced(ctx, 1e9, to-from, 16, func(ctx context.Context, i int) error {
			return side.send(ctx, q, from+i, sendBody(from+i))
		}); err != nil {
			return fmt.Errorf("building the backlog: %w", err)
		}
		return side.closeBacklog(ctx, q)
	}
	var con steadyConsumer
	defer func() {
		if con != nil {
			_ = con.stop(context.WithoutCancel(ctx))
		}
	}()
	var gate *loopGate
	warmup := 0
	if cfg.warm {
		warmup, gate = events/10, &loopGate{}
		if con, err = start(ctx, gate); err != nil {
			return res, err
		}
		if err := backlog(events, events+warmup); err != nil {
			return res, err
		}
		if err := lat.waitDelivered(ctx, warmup); err != nil {
			return res, fmt.Errorf("warming up: %w", err)
		}
		gate.close()
	}
	if err := backlog(0, events); err != nil {
		return res, err
	}
	m0, err := side.begin(ctx, q)
	if err != nil {
		return res, err
	}
	t0 := time.Now()
	if gate != nil {
		gate.open()
	} else if con, err = start(ctx, nil); err != nil {
		return res, err
	}
	if err := lat.waitDelivered(ctx, warmup+events); err != nil {
		return res, err
	}
	res.took = time.Since(t0)
	if err := side.end(ctx, q, m0, &res); err != nil {
		return res, err
	}
	res.events, res.achieved = events, float64(events)/res.took.Seconds()
	err, con = con.stop(ctx), nil
	if err != nil {
		return res, fmt.Errorf("stopping the consumer: %w", err)
	}
	side.e.logf("   %-8s %-22s %s", side.system, cfg.name(), res.line())
	return res, nil
}

// loopGate holds SQL loops before their receive calls while it is
// closed; a nil gate never holds.
type loopGate struct {
	mu   sync.Mutex
	shut chan struct{} // nil while open
}

func (g *loopGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *loopGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// wait returns when the gate is open or ctx is done.
func (g *loopGate) wait(ctx context.Context) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut == nil {
		return nil
	}
	select {
	case <-shut:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// holdHorizon opens a REPEATABLE READ transaction with an xid on another
// connection to dsn and returns its release.
func holdHorizon(ctx context.Context, dsn string) (func(), error) {
	hold, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	tx, err := hold.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err == nil {
		_, err = tx.Exec(ctx, "select txid_current()")
	}
	release := func() {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
		hold.Close(context.WithoutCancel(ctx))
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// begin resets pg_stat_statements and reads the counters at the start of
// a window.
func (side *steadySide) begin(ctx context.Context, q string) (steadyMark, error) {
	if err := side.pgss.reset(ctx); err != nil {
		return steadyMark{}, err
	}
	return side.mark(ctx, q)
}

// end reads the counters at the end of a window into res.
func (side *steadySide) end(ctx context.Context, q string, m0 steadyMark, res *steadyResult) error {
	m1, err := side.mark(ctx, q)
	if err != nil {
		return err
	}
	if res.pgss, err = side.pgss.read(ctx); err != nil {
		return err
	}
	if side.proc != nil {
		res.cpu = cpuDelta(m0.cpu, m1.cpu)
	}
	res.ticks, res.walBytes, res.load = m1.tick-m0.tick, m1.wal-m0.wal, loadAverage()
	return nil
}

// steadyMark is what the server's counters say at one end of a window.
type steadyMark struct {
	cpu  cpuSnapshot
	wal  int64
	tick int64
}

func (side *steadySide) mark(ctx context.Context, q string) (steadyMark, error) {
	var m steadyMark
	var err error
	if m.cpu, err = side.proc.snapshot(ctx, steadyGroups); err != nil {
		return m, err
	}
	if m.wal, err = walLSN(ctx, side.probe); err != nil {
		return m, err
	}
	m.tick, err = side.lastTick(ctx, q)
	return m, err
}

// lastTick returns the last tick id handed out (the sequence is shared by
// every queue of the database).
func lastTick(ctx context.Context, c *pgx.Conn) (int64, error) {
	var n int64
	err := c.QueryRow(ctx, "select coalesce(pg_sequence_last_value('pgque.tick_id_seq'), 0)").Scan(&n)
	return n, err
}

// loadAverage returns the machine's 1-minute load average ("?" where
// /proc/loadavg is not readable): the figures of a busy machine are
// noisier and its latencies longer.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// goConsumer is the Go PartitionedConsumer.
type goConsumer struct {
	client *pgque.Client
	pc     *pgque.PartitionedConsumer
}

func (g *goConsumer) stop(ctx context.Context) error {
	if g.pc == nil {
		return nil
	}
	err := g.pc.Stop(ctx)
	g.client.Close()
	g.pc = nil
	return err
}

// startGo starts a PartitionedConsumer of q on pool with cfg's slots,
// GatherReceives for the "gogather" client and handlers that take
// cfg.handle after recording the event's latency, and waits until it owns
// every slot.
func startGo(ctx context.Context, pool *pgxpool.Pool, q string, cfg steadyConfig, lat *latencyLog) (steadyConsumer, error) {
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	slots := cfg.slots
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: q, Consumer: "c", Slots: slots,
		GatherReceives: cfg.client == "gogather",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			if err := lat.record(m.Payload, time.Now()); err != nil || cfg.handle <= 0 {
				return err
			}
			select {
			case <-time.After(cfg.handle):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}})
	if err != nil {
		client.Close()
		return nil, err
	}
	if err := pc.Start(ctx); err != nil {
		client.Close()
		return nil, err
	}
	g := &goConsumer{client: client, pc: pc}
	if !waitFor(ctx, 30*time.Second, func() bool { return len(pc.OwnedSlots()) == slots }) {
		_ = g.stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("the %d-slot consumer did not own its slots within 30s", slots)
	}
	return g, nil
}

// sqlLoops is one plain SQL loop per slot, each on its own connection.
type sqlLoops struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
	conns  []*pgx.Conn
}

func (s *sqlLoops) stop(ctx context.Context) error {
	if s.cancel != nil {
		s.cancel()
		s.wg.Wait()
		s.cancel = nil
	}
	for _, c := range s.conns {
		c.Close(ctx)
	}
	s.conns = nil
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// startSlotLoops runs one loop per slot, each on its own connection to
// dsn that LISTENs on channel first.
func startSlotLoops(ctx context.Context, dsn string, slots int, channel string,
	loop func(ctx context.Context, c *pgx.Conn, k int) error) (steadyConsumer, error) {
	s := &sqlLoops{}
	fail := func(err error) (steadyConsumer, error) { _ = s.stop(context.WithoutCancel(ctx)); return nil, err }
	for range slots {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fail(err)
		}
		s.conns = append(s.conns, c)
		if _, err := c.Exec(ctx, "listen "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return fail(err)
		}
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	for k, c := range s.conns {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := loop(lctx, c, k); err != nil && lctx.Err() == nil {
				s.mu.Lock()
				s.err = errors.Join(s.err, err)
				s.mu.Unlock()
			}
		}()
	}
	return s, nil
}

// sqlSlotLoop is pgque's loop for slot k, as a client in another language
// would write it: on each notification on pgque_slots whose touched set
// names the slot (or at the latest after a second, the poll),
// receive_partitioned_raw (chunks of sqlLoopChunk, each call acknowledging
// the previous chunk) until a chunk ends the slot's batch. A shorter chunk
// under the byte budget did: the next call would only
// acknowledge it and find nothing, so the loop waits for the next
// notification naming the slot, and the acknowledgement rides on that
// call, or goes after 100 ms at the latest (as the Go pool and the
// TypeScript worker do; docs/design.md, "Wake-ups proportional to work").
func sqlSlotLoop(ctx context.Context, c *pgx.Conn, q string, k, n int, token, tag string, lat *latencyLog, gate *loopGate) error {
	var ack [3]*int64
	for {
		for {
			if err := gate.wait(ctx); err != nil {
				return err
			}
			rows, err := c.Query(ctx, "select msg_id, batch_id, payload, epoch from pgque.receive_partitioned_raw($1, 'c', $2, $3, 'sql-loop', $4::uuid, $5, $6, $7, $8)",
				q, k, n, token, sqlLoopChunk, ack[0], ack[1], ack[2])
			if err != nil {
				return fmt.Errorf("receive_partitioned_raw slot %d/%d: %w", k, n, err)
			}
			got, bytes := 0, 0
			now := time.Now()
			var next [3]*int64
			for rows.Next() {
				var msgID, batchID, epoch int64
				var payload []byte
				if err := rows.Scan(&msgID, &batchID, &payload, &epoch); err != nil {
					rows.Close()
					return err
				}
				if got == 0 {
					next = [3]*int64{&epoch, &batchID, &msgID}
				}
				if err := lat.record(payload, now); err != nil {
					rows.Close()
					return err
				}
				got, bytes = got+1, bytes+len(payload)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("receive_partitioned_raw slot %d/%d: %w", k, n, err)
			}
			ack = next
			if got == 0 || (got < sqlLoopChunk && bytes < sqlLoopFoldBytes) {
				break
			}
		}
		wait := time.Second
		if ack[0] != nil {
			wait = 100 * time.Millisecond
		}
		if err := waitTouched(ctx, c, tag, n, k, wait); err != nil {
			return err
		}
	}
}

// sqlLoopChunk is the loop's i_max: the chunk size pgque's own clients
// default to (pgque.BatchSizeDefault in Go, chunkSize in TypeScript), as a
// client written after them would use.
const sqlLoopChunk = pgque.BatchSizeDefault

// sqlLoopFoldBytes: a chunk of fewer bytes was not cut by the server's
// byte budget per chunk (pgque._chunk_bytes, 32 MiB); the Go pool's bound.
const sqlLoopFoldBytes = 1 << 20

// waitTouched waits for a touched set naming slot k of n, or for wait.
func waitTouched(ctx context.Context, c *pgx.Conn, tag string, n, k int, wait time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		note, err := c.WaitForNotification(wctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return nil // the poll
		case err != nil:
			return err
		}
		if _, touched := workerpool.Touches(note.Payload, tag, n, k); touched {
			return nil
		}
	}
}

// line is the one-line summary of a result for the progress output.
func (r steadyResult) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5d ev at %6.0f/s, %4.0f ticks/s, load %s", r.events, r.achieved, float64(r.ticks)/r.took.Seconds(), r.load)
	if c, ok := r.pgss["consume"]; ok {
		fmt.Fprintf(&b, " | recv+ack %6.0f µs/ev %5.2f calls/ev %5.1f buf/ev", r.per(c.execMS*1000), r.per(c.calls), r.per(c.buffers))
	}
	if r.cpu != nil {
		fmt.Fprintf(&b, " | cpu consumer %6.0f producers %4.0f ticker %4.0f all %6.0f µs/ev", r.per(r.cpu["consumer"]*1e6),
			r.per(r.cpu["producer"]*1e6), r.per(r.cpu["ticker"]*1e6), r.per(r.cpu["all"]*1e6))
	}
	fmt.Fprintf(&b, " | wal %5.0f B/ev", r.per(float64(r.walBytes)))
	if len(r.ms) > 0 {
		fmt.Fprintf(&b, " | p50 %5.1f ms p99 %5.1f ms", percentile(r.ms, 50), percentile(r.ms, 99))
	}
	return b.String()
}

// recordSteady adds a result's figures to the report.
func recordSteady(r *recorder, res steadyResult) {
	n := res.caseName()
	note := fmt.Sprintf("%d events at %s/s (target %d/s) over %s, %s ticks/s, load average %s", res.events, fmtNum(res.achieved),
		res.cfg.rate, res.took.Round(time.Millisecond), fmtNum(float64(res.ticks)/res.took.Seconds()), res.load)
	if res.cfg.drain {
		note = fmt.Sprintf("a backlog of %d events drained in %s, load average %s", res.events, res.took.Round(time.Millisecond), res.load)
		r.add(n+"_rate", single(res.achieved), "events/s", nil, note)
		note = ""
	}
	if c, ok := res.pgss["consume"]; ok {
		r.add(n+"_recv_ack_time", single(res.per(c.execMS*1000)), "µs/event", nil, strings.TrimPrefix(note+"; pg_stat_statements, receive and ack statements", "; "))
		note = ""
		r.add(n+"_recv_ack_calls", single(res.per(c.calls)), "calls/event", nil, "")
		r.add(n+"_recv_ack_buffers", single(res.per(c.buffers)), "buffers/event", nil, "shared blocks hit + read")
	}
	if s, ok := res.pgss["send"]; ok && !res.cfg.drain {
		r.add(n+"_send_time", single(res.per(s.execMS*1000)), "µs/event", nil, note)
		note = ""
	}
	if res.ticks > 0 && !res.cfg.drain {
		r.add(n+"_ticks", single(float64(res.ticks)/res.took.Seconds()), "ticks/s", nil, "ticks of the whole cluster in the window")
	}
	if res.cpu != nil && res.cpu["consumer"] > 0 {
		r.add(n+"_cpu_consumer", single(res.per(res.cpu["consumer"]*1e6)), "µs/event", nil,
			strings.TrimPrefix(note+"; /proc utime+stime of the consumer's backends", "; "))
		note = ""
	}
	if res.cpu != nil && res.cpu["all"] > 0 {
		r.add(n+"_cpu_server", single(res.per(res.cpu["all"]*1e6)), "µs/event", nil, "every server process: producers, ticker, consumer, background")
	}
	if res.walBytes > 0 {
		r.add(n+"_wal", single(res.per(float64(res.walBytes))), "bytes/event", nil,
			strings.TrimPrefix(note+"; pg_current_wal_insert_lsn delta, whole cluster", "; "))
		note = ""
	}
	if res.cfg.drain || res.cfg.client == "none" {
		return
	}
	var t50, t99 *target
	if res.cfg.rate >= 500 && res.system == "pgque" && res.cfg.tick == 0 {
		t50, t99 = valueAtMost(10), valueAtMost(50)
	}
	r.add(n+"_latency_p50", single(percentile(res.ms, 50)), "ms", t50, note)
	r.add(n+"_latency_p99", single(percentile(res.ms, 99)), "ms", t99, "")
}

// steadyFigure is one column of the tables: a figure of a result, and
// whether it was measured.
type steadyFigure struct {
	head, unit, format string
	get                func(r steadyResult) (float64, bool)
}

var steadyFigures = []steadyFigure{
	{"ev/s", "events/s", "%.0f", func(r steadyResult) (float64, bool) { return r.achieved, true }},
	{"ticks/s", "ticks/s", "%.0f", func(r steadyResult) (float64, bool) { return float64(r.ticks) / r.took.Seconds(), !r.cfg.drain }},
	{"recv+ack µs/ev", "µs/event", "%.0f", func(r steadyResult) (float64, bool) {
		c, ok := r.pgss["consume"]
		return r.per(c.execMS * 1000), ok
	}},
	{"calls/ev", "calls/event", "%.2f", func(r steadyResult) (float64, bool) { c, ok := r.pgss["consume"]; return r.per(c.calls), ok }},
	{"buffers/ev", "buffers/event", "%.1f", func(r steadyResult) (float64, bool) { c, ok := r.pgss["consume"]; return r.per(c.buffers), ok }},
	{"send µs/ev", "µs/event", "%.0f", func(r steadyResult) (float64, bool) {
		s, ok := r.pgss["send"]
		return r.per(s.execMS * 1000), ok && !r.cfg.drain
	}},
	{"CPU consumer µs/ev", "µs/event", "%.0f", func(r steadyResult) (float64, bool) { return r.per(r.cpu["consumer"] * 1e6), r.cpu != nil }},
	cpuServerFigure,
	{"WAL B/ev", "bytes/event", "%.0f", func(r steadyResult) (float64, bool) { return r.per(float64(r.walBytes)), true }},
	{"p50 ms", "ms", "%.1f", func(r steadyResult) (float64, bool) { return percentile(r.ms, 50), len(r.ms) > 0 && !r.cfg.drain }},
	{"p99 ms", "ms", "%.1f", func(r steadyResult) (float64, bool) { return percentile(r.ms, 99), len(r.ms) > 0 && !r.cfg.drain }},
}

// cpuServerFigure is the CPU of every server process per event, which
// steadyFloor also sets beside upstream's.
var cpuServerFigure = steadyFigure{"CPU server µs/ev", "µs/event", "%.0f", func(r steadyResult) (float64, bool) {
	return r.per(r.cpu["all"] * 1e6), r.cpu != nil
}}

// cell formats figure f of r, "–" when it was not measured.
func (f steadyFigure) cell(r steadyResult) string {
	v, ok := f.get(r)
	if !ok {
		return "–"
	}
	return fmt.Sprintf(f.format, v)
}

// steadyTable prints every configuration as one Markdown table row, the
// form docs/benchmarks.md records.
func steadyTable(e *env, results []steadyResult) {
	head, rule := "   | system | config | load |", "   | --- | --- | ---: |"
	for _, f := range steadyFigures {
		head += " " + f.head + " |"
		rule += " ---: |"
	}
	e.logf("%s", head)
	e.logf("%s", rule)
	for _, r := range results {
		row := fmt.Sprintf("   | %s | %s | %s |", r.system, r.cfg.name(), r.load)
		for _, f := range steadyFigures {
			row += " " + f.cell(r) + " |"
		}
		e.logf("%s", row)
	}
}
