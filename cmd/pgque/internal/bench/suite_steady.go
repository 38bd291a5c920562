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
// (10 ms ticks); a consumer of 1, 4 or 16 slots takes the events, either
// the Go PartitionedConsumer ("go") or one plain SQL loop per slot ("sql")
// that wakes on each tick notification and calls receive_partitioned_raw
// with the folded ack until a call returns nothing, as a client without
// the Go library would. Each configuration runs once without and once with
// a REPEATABLE READ transaction held open on another connection.
//
// Over the measured window (the producers' run plus the drain of what they
// sent) it reports, per event: the server time of the receive and ack
// statements (pg_stat_statements, top-level, so a function's inner
// statements are inside its caller's time), the calls and buffer accesses
// of those statements, the CPU time of the consumer's backends and of every
// server process (utime+stime from /proc), the WAL the cluster wrote, and
// the delivery latency from Send to the handler (p50, p99).

func init() {
	register(&suite{
		name:    "steady",
		about:   "server time, CPU, calls, buffers and WAL per event, and latency, at 100/500/2000 ev/s, 1/4/16 slots, Go pool and SQL loop, with and without a held horizon",
		run:     runSteady,
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
	client string // "go" or "sql"
	held   bool
}

func (c steadyConfig) name() string {
	h := "free"
	if c.held {
		h = "held"
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
	for _, r := range rates {
		for _, s := range slots {
			for _, h := range held {
				for _, c := range clients {
					out = append(out, steadyConfig{rate: r, slots: s, client: c, held: h})
				}
			}
		}
	}
	return out
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
	cfg      steadyConfig
	events   int
	achieved float64 // events/s the producers reached
	took     time.Duration
	pgss     map[string]pgssStat // nil without pg_stat_statements
	cpu      map[string]float64  // CPU seconds by group; nil without /proc
	walBytes int64
	ticks    int64     // ticks the ticker made in the window (all queues; only this one is busy)
	load     string    // the machine's 1-minute load average at the end
	ms       []float64 // sorted delivery latencies
}

func (r steadyResult) per(v float64) float64 { return v / float64(max(r.events, 1)) }

// steadyRig is what every configuration shares: the database, the ticker,
// the producers' client and the probes.
type steadyRig struct {
	e        *env
	p        *pgqueDB
	producer *pgque.Client
	consPool *pgxpool.Pool
	consDSN  string
	probe    *pgx.Conn
	pgss     *pgssProbe
	proc     *procProbe
}

func runSteady(ctx context.Context, e *env, r *recorder) error {
	rig, stop, err := newSteadyRig(ctx, e)
	if err != nil {
		return err
	}
	defer stop()
	d := pick(e, 3*time.Second, 20*time.Second)
	var results []steadyResult
	for _, cfg := range steadyConfigs(e) {
		res, err := rig.run(ctx, cfg, d)
		if err != nil {
			return fmt.Errorf("%s: %w", cfg.name(), err)
		}
		results = append(results, res)
		rig.record(r, res)
	}
	rig.table(results)
	return nil
}

func newSteadyRig(ctx context.Context, e *env) (*steadyRig, func(), error) {
	p, err := newPgque(ctx, e, "bench_steady", 8)
	if err != nil {
		return nil, nil, err
	}
	rig := &steadyRig{e: e, p: p}
	var closers []func()
	stop := func() {
		for _, f := range slices.Backward(closers) {
			f()
		}
	}
	fail := func(err error) (*steadyRig, func(), error) { stop(); return nil, nil, err }

	rig.probe, err = pgx.Connect(ctx, p.dsn)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func() { rig.probe.Close(context.WithoutCancel(ctx)) })
	pgss, why, err := newPgssProbe(ctx, rig.probe)
	if err != nil {
		return fail(err)
	}
	if pgss == nil {
		e.logf("   no server-time, calls or buffer figures: %s", why)
	}
	rig.pgss = pgss
	proc, why := newProcProbe(ctx, rig.probe)
	if proc == nil {
		e.logf("   no CPU figures: %s", why)
	}
	rig.proc = proc

	tickPool, err := namedPool(ctx, e, p.dsn, steadyAppTicker, 4)
	if err != nil {
		return fail(err)
	}
	tickClient, err := pgque.NewClient(tickPool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, tickClient.Close)
	ticker, err := tickClient.NewTicker(nil)
	if err != nil {
		return fail(err)
	}
	if err := ticker.Start(ctx); err != nil {
		return fail(err)
	}
	closers = append(closers, func() { _ = ticker.Stop(context.WithoutCancel(ctx)) })
	if !waitFor(ctx, 30*time.Second, ticker.IsLeader) {
		return fail(fmt.Errorf("the ticker did not become leader within 30s"))
	}

	prodPool, err := namedPool(ctx, e, p.dsn, steadyAppProducer, 16)
	if err != nil {
		return fail(err)
	}
	rig.producer, err = pgque.NewClient(prodPool, &pgque.Config{Logger: quietLogger, PollOnly: true})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, rig.producer.Close)
	rig.consDSN = withAppName(p.dsn, steadyAppConsumer)
	return rig, stop, nil
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

// run measures one configuration on a fresh queue.
func (rig *steadyRig) run(ctx context.Context, cfg steadyConfig, d time.Duration) (steadyResult, error) {
	res := steadyResult{cfg: cfg}
	q := rig.p.fresh("steady")
	if _, err := rig.producer.CreateQueue(ctx, q); err != nil {
		return res, err
	}
	lat := &latencyLog{seen: map[int]bool{}}
	var con steadyConsumer
	var err error
	if cfg.client == "go" {
		con, err = rig.startGo(ctx, q, cfg.slots, lat)
	} else {
		con, err = startSQLLoops(ctx, rig.consDSN, q, cfg.slots, lat)
	}
	if err != nil {
		return res, err
	}
	defer func() { _ = con.stop(context.WithoutCancel(ctx)) }()

	if cfg.held {
		hold, err := pgx.Connect(ctx, rig.p.dsn)
		if err != nil {
			return res, err
		}
		defer hold.Close(context.WithoutCancel(ctx))
		tx, err := hold.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return res, err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := tx.Exec(ctx, "select txid_current()"); err != nil {
			return res, err
		}
	}

	if err := rig.pgss.reset(ctx); err != nil {
		return res, err
	}
	m0, err := rig.mark(ctx)
	if err != nil {
		return res, err
	}

	total := int(float64(cfg.rate) * d.Seconds())
	sent, took, err := paced(ctx, cfg.rate, total, 16, func(ctx context.Context, i int) error {
		b, _ := json.Marshal(timedPayload{Tenant: steadyKey(i), Seq: i, SentNS: time.Now().UnixNano()})
		_, err := rig.producer.Send(ctx, q, pgque.Event{Type: eventType, Payload: json.RawMessage(b), PartitionKey: steadyKey(i)})
		return err
	})
	if err != nil {
		return res, fmt.Errorf("producer: %w", err)
	}
	// Wait while events keep arriving; 30 s without progress means
	// delivery is stuck.
	last, lastChange := lat.n.Load(), time.Now()
	for h := last; h < int64(sent); h = lat.n.Load() {
		if h != last {
			last, lastChange = h, time.Now()
		}
		if time.Since(lastChange) > 30*time.Second {
			return res, fmt.Errorf("%d of %d events delivered, none for 30 s", h, sent)
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		time.Sleep(5 * time.Millisecond)
	}

	m1, err := rig.mark(ctx)
	if err != nil {
		return res, err
	}
	res.pgss, err = rig.pgss.read(ctx)
	if err != nil {
		return res, err
	}
	if rig.proc != nil {
		res.cpu = cpuDelta(m0.cpu, m1.cpu)
	}
	res.ticks, res.walBytes, res.load = m1.tick-m0.tick, m1.wal-m0.wal, loadAverage()
	res.events, res.took, res.achieved = sent, took, float64(sent)/took.Seconds()
	lat.mu.Lock()
	res.ms = slices.Clone(lat.ms)
	lat.mu.Unlock()
	slices.Sort(res.ms)
	if err := con.stop(ctx); err != nil {
		return res, fmt.Errorf("stopping the consumer: %w", err)
	}
	rig.e.logf("   %-22s %s", cfg.name(), res.line())
	return res, nil
}

// steadyMark is what the server's counters say at one end of a window.
type steadyMark struct {
	cpu  cpuSnapshot
	wal  int64
	tick int64
}

func (rig *steadyRig) mark(ctx context.Context) (steadyMark, error) {
	var m steadyMark
	var err error
	if m.cpu, err = rig.proc.snapshot(ctx, steadyGroups); err != nil {
		return m, err
	}
	if m.wal, err = walLSN(ctx, rig.probe); err != nil {
		return m, err
	}
	m.tick, err = lastTick(ctx, rig.probe)
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

func (rig *steadyRig) startGo(ctx context.Context, q string, slots int, lat *latencyLog) (steadyConsumer, error) {
	if rig.consPool == nil {
		pool, err := rig.e.pool(ctx, rig.consDSN, 40)
		if err != nil {
			return nil, err
		}
		rig.consPool = pool
	}
	client, err := pgque.NewClient(rig.consPool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: q, Consumer: "c", Slots: slots,
		Handler: func(ctx context.Context, m *pgque.Message) error { return lat.record(m.Payload, time.Now()) }})
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

// startSQLLoops subscribes and claims every slot of an N-slot consumer,
// then runs one loop per slot on its own connection, as a client in
// another language would: LISTEN pgque_slots, and on each notification
// whose touched set names the slot (or at the latest after a second, the
// poll), receive_partitioned_raw (chunks of 100, each call acknowledging
// the previous chunk) until a call returns no rows.
func startSQLLoops(ctx context.Context, dsn, q string, slots int, lat *latencyLog) (steadyConsumer, error) {
	s := &sqlLoops{}
	fail := func(err error) (steadyConsumer, error) { _ = s.stop(context.WithoutCancel(ctx)); return nil, err }
	for range slots {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fail(err)
		}
		s.conns = append(s.conns, c)
	}
	tokens, err := subscribeSlots(ctx, s.conns[0], q, "c", slots, "sql-loop")
	if err != nil {
		return fail(err)
	}
	tag := workerpool.TickTag(q)
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	for k, c := range s.conns {
		if _, err := c.Exec(ctx, "listen "+workerpool.SlotsChannel); err != nil {
			return fail(err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := sqlSlotLoop(lctx, c, q, k, slots, tokens[k], tag, lat); err != nil && lctx.Err() == nil {
				s.mu.Lock()
				s.err = errors.Join(s.err, err)
				s.mu.Unlock()
			}
		}()
	}
	return s, nil
}

func sqlSlotLoop(ctx context.Context, c *pgx.Conn, q string, k, n int, token, tag string, lat *latencyLog) error {
	var ack [3]*int64
	for {
		for {
			rows, err := c.Query(ctx, "select msg_id, batch_id, payload, epoch from pgque.receive_partitioned_raw($1, 'c', $2, $3, 'sql-loop', $4::uuid, 100, $5, $6, $7)",
				q, k, n, token, ack[0], ack[1], ack[2])
			if err != nil {
				return fmt.Errorf("receive_partitioned_raw slot %d/%d: %w", k, n, err)
			}
			got := 0
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
				got++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("receive_partitioned_raw slot %d/%d: %w", k, n, err)
			}
			ack = next
			if got == 0 {
				break
			}
		}
		if err := waitTouched(ctx, c, tag, n, k); err != nil {
			return err
		}
	}
}

// waitTouched waits for a touched set naming slot k of n, or a second.
func waitTouched(ctx context.Context, c *pgx.Conn, tag string, n, k int) error {
	wctx, cancel := context.WithTimeout(ctx, time.Second)
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
		fmt.Fprintf(&b, " | cpu consumer %6.0f µs/ev all %6.0f µs/ev", r.per(r.cpu["consumer"]*1e6), r.per(r.cpu["all"]*1e6))
	}
	fmt.Fprintf(&b, " | wal %5.0f B/ev | p50 %5.1f ms p99 %5.1f ms", r.per(float64(r.walBytes)), percentile(r.ms, 50), percentile(r.ms, 99))
	return b.String()
}

// record adds a result's figures to the report.
func (rig *steadyRig) record(r *recorder, res steadyResult) {
	n := res.cfg.name()
	note := fmt.Sprintf("%d events at %s/s (target %d/s) over %s, %s ticks/s, load average %s", res.events, fmtNum(res.achieved),
		res.cfg.rate, res.took.Round(time.Millisecond), fmtNum(float64(res.ticks)/res.took.Seconds()), res.load)
	if c, ok := res.pgss["consume"]; ok {
		r.add(n+"_recv_ack_time", single(res.per(c.execMS*1000)), "µs/event", nil, note+"; pg_stat_statements, receive and ack statements")
		note = ""
		r.add(n+"_recv_ack_calls", single(res.per(c.calls)), "calls/event", nil, "")
		r.add(n+"_recv_ack_buffers", single(res.per(c.buffers)), "buffers/event", nil, "shared blocks hit + read")
	}
	if s, ok := res.pgss["send"]; ok {
		r.add(n+"_send_time", single(res.per(s.execMS*1000)), "µs/event", nil, note)
		note = ""
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
	var t50, t99 *target
	if res.cfg.rate >= 500 {
		t50, t99 = valueAtMost(10), valueAtMost(50)
	}
	r.add(n+"_latency_p50", single(percentile(res.ms, 50)), "ms", t50, note)
	r.add(n+"_latency_p99", single(percentile(res.ms, 99)), "ms", t99, "")
}

// table prints every configuration as one Markdown table row, the form
// docs/benchmarks.md records.
func (rig *steadyRig) table(results []steadyResult) {
	e := rig.e
	e.logf("   | config | load | ev/s | ticks/s | recv+ack µs/ev | calls/ev | buffers/ev | send µs/ev | CPU consumer µs/ev | CPU server µs/ev | WAL B/ev | p50 ms | p99 ms |")
	e.logf("   | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	dash := func(ok bool, v float64, f string) string {
		if !ok {
			return "–"
		}
		return fmt.Sprintf(f, v)
	}
	for _, r := range results {
		c, okC := r.pgss["consume"]
		s, okS := r.pgss["send"]
		e.logf("   | %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %s | %.0f | %.1f | %.1f |", r.cfg.name(), r.load, r.achieved, float64(r.ticks)/r.took.Seconds(),
			dash(okC, r.per(c.execMS*1000), "%.0f"), dash(okC, r.per(c.calls), "%.2f"), dash(okC, r.per(c.buffers), "%.1f"),
			dash(okS, r.per(s.execMS*1000), "%.0f"),
			dash(r.cpu != nil, r.per(r.cpu["consumer"]*1e6), "%.0f"), dash(r.cpu != nil, r.per(r.cpu["all"]*1e6), "%.0f"),
			r.per(float64(r.walBytes)), percentile(r.ms, 50), percentile(r.ms, 99))
	}
}
