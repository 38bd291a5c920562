package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The steady suite's upstream half (see upstream.go): upstream PgQue as a
// steadySide, and the table that sets its figures beside pgque's.

// newUpstreamSide sets up upstream PgQue: the installer in database
// bench_steady_upstream, its default schedule driven by upstreamTicker, a
// pool for the producers and the probes.
func newUpstreamSide(ctx context.Context, e *env) (*steadySide, error) {
	u, err := newUpstream(ctx, e, "bench_steady_upstream", 4)
	if err != nil {
		return nil, err
	}
	side, err := newSteadySide(ctx, e, "upstream", u.dsn)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*steadySide, error) { side.stop(); return nil, err }
	ticker, err := startUpstreamTicker(ctx, u.dsn)
	if err != nil {
		return fail(err)
	}
	side.closers = append(side.closers, func() {
		if err := ticker.stop(); err != nil {
			e.logf("   %v", err)
		}
	})
	e.logf("   upstream's ticker: CALL pgque.ticker_loop() every second (its pg_cron default: pgque.ticker() every 100 ms inside it), maint every 30 s, rotate step 2 every 10 s, driven by the bench")
	prodPool, err := namedPool(ctx, e, u.dsn, steadyAppProducer, 16)
	if err != nil {
		return fail(err)
	}
	side.closers = append(side.closers, prodPool.Close)
	consDSN := withAppName(u.dsn, steadyAppConsumer)

	side.newQueue = func(ctx context.Context, _ steadyConfig) (string, error) {
		q := u.fresh("steady")
		_, err := prodPool.Exec(ctx, "select pgque.create_queue($1)", q)
		return q, err
	}
	side.send = func(ctx context.Context, q string, i int, body []byte) error {
		_, err := prodPool.Exec(ctx, upstreamSendSQL, q, eventType, string(body), steadyKey(i))
		return err
	}
	side.sqlConsumer = func(ctx context.Context, q string, slots int, lat *latencyLog) (func(context.Context, *loopGate) (steadyConsumer, error), error) {
		c, err := pgx.Connect(ctx, consDSN)
		if err != nil {
			return nil, err
		}
		defer c.Close(context.WithoutCancel(ctx))
		if err := subscribeUpstreamSlots(ctx, c, q, slots); err != nil {
			return nil, err
		}
		return func(ctx context.Context, gate *loopGate) (steadyConsumer, error) {
			return startSlotLoops(ctx, consDSN, slots, "pgque_"+q, func(ctx context.Context, c *pgx.Conn, k int) error {
				return upstreamSlotLoop(ctx, c, q, k, slots, lat, gate)
			})
		}, nil
	}
	side.lastTick = func(ctx context.Context, q string) (int64, error) { return upstreamLastTick(ctx, side.probe, q) }
	// force_next_tick makes upstream's next scheduled ticker() call tick;
	// the bench waits for that tick.
	side.closeBacklog = func(ctx context.Context, q string) error {
		before, err := side.lastTick(ctx, q)
		if err != nil {
			return err
		}
		if _, err := side.probe.Exec(ctx, "select pgque.force_next_tick($1)", q); err != nil {
			return fmt.Errorf("upstream force_next_tick: %w", err)
		}
		var after int64
		if !waitFor(ctx, 10*time.Second, func() bool {
			after, err = side.lastTick(ctx, q)
			return err != nil || after > before
		}) {
			return fmt.Errorf("upstream's ticker made no tick within 10 s of force_next_tick")
		}
		return err
	}
	return side, nil
}

// steadyCompare prints, for each configuration upstream ran, each figure
// of upstream beside pgque's SQL loop and Go pool and their ratios
// (pgque / upstream: below 1 is pgque spending less, or for ev/s
// delivering less), and records the ratios in the report.
func steadyCompare(e *env, r *recorder, results []steadyResult) {
	find := func(system, name string) (steadyResult, bool) {
		for _, res := range results {
			if res.system == system && res.cfg.name() == name {
				return res, true
			}
		}
		return steadyResult{}, false
	}
	e.logf("   pgque beside upstream PgQue %s; ratio = pgque / upstream", e.upstream.describe())
	e.logf("   | config | figure | pgque SQL loop | pgque Go pool | upstream | SQL loop / upstream | Go pool / upstream |")
	e.logf("   | --- | --- | ---: | ---: | ---: | ---: | ---: |")
	for _, up := range results {
		if up.system != "upstream" {
			continue
		}
		name := up.cfg.name()
		sqlRes, okSQL := find("pgque", name)
		goCfg := up.cfg
		goCfg.client = "go"
		goRes, okGo := find("pgque", goCfg.name())
		for _, f := range steadyFigures {
			uv, ok := f.get(up)
			if !ok {
				continue
			}
			ratio := func(res steadyResult, have bool) string {
				v, ok := f.get(res)
				if !have || !ok || uv == 0 {
					return "–"
				}
				return fmtNum(v/uv) + "×"
			}
			cell := func(res steadyResult, have bool) string {
				if !have {
					return "–"
				}
				return f.cell(res)
			}
			e.logf("   | %s | %s | %s | %s | %s | %s | %s |", name, f.head, cell(sqlRes, okSQL), cell(goRes, okGo), f.cell(up),
				ratio(sqlRes, okSQL), ratio(goRes, okGo))
			for _, p := range []struct {
				res  steadyResult
				have bool
			}{{sqlRes, okSQL}, {goRes, okGo}} {
				if v, ok := f.get(p.res); p.have && ok {
					r.compare(p.res.caseName()+"_vs_upstream_"+steadySlug(f.head), single(v), up.caseName()+"_"+steadySlug(f.head), single(uv), f.unit, nil, "")
				}
			}
		}
	}
	steadyFloor(e, r, results, find)
}

// steadyFloor prints and records, for each rate, the server CPU per event
// of pgque with a consumer that never receives (client "none") beside
// upstream's with its SQL loop consuming: what pgque spends before any
// consumer work, against what upstream spends in all.
func steadyFloor(e *env, r *recorder, results []steadyResult, find func(system, name string) (steadyResult, bool)) {
	cpu := cpuServerFigure
	for _, up := range results {
		if up.system != "upstream" || up.cfg.client != "sql" || up.cfg.held || up.cfg.drain || up.cfg.slots != 16 {
			continue
		}
		floor, ok := find("pgque", steadyConfig{rate: up.cfg.rate, slots: 16, client: "none"}.name())
		fv, okF := cpu.get(floor)
		uv, okU := cpu.get(up)
		if !ok || !okF || !okU || uv == 0 {
			continue
		}
		e.logf("   %s ev/s: pgque's server CPU with no consumer work (%s) is %s µs/event, upstream's in all (%s) %s µs/event: %s×",
			fmtNum(float64(up.cfg.rate)), floor.cfg.name(), cpu.cell(floor), up.cfg.name(), cpu.cell(up), fmtNum(fv/uv))
		r.compare(floor.caseName()+"_vs_upstream_"+up.cfg.name()+"_cpu_server", single(fv), up.caseName()+"_cpu_server", single(uv), cpu.unit, nil,
			"pgque's producers, ticker and background with a consumer that never receives, against upstream with its consumer")
	}
}

// steadySlug turns a column heading into a case suffix: "recv+ack µs/ev"
// becomes "recv_ack_us_ev".
func steadySlug(head string) string {
	return strings.Trim(strings.NewReplacer("+", "_", " ", "_", "/", "_", "µ", "u").Replace(strings.ToLower(head)), "_")
}
