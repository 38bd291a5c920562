package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/pgque/pgque"
)

// ts: the TypeScript package (clients/typescript, built from this
// checkout) against pg-boss, both on the same Node.js and the same
// cluster, in interleaved rounds:
//
//   - free handler: work() over 8 slots (default concurrency) against
//     pg-boss key_strict_fifo with 8 workers, as in peers;
//   - the lanes workload (200 tenants, 20 ms handler): work() over 16
//     slots at the package's default concurrency (256, the Go pool's
//     MaxWorkers default) and at 64 (the default before), against pg-boss
//     with 16 workers, and against the ideal;
//   - send() from 16 concurrent callers and from one on a pg.Pool, and
//     sendBatch() of 1000, against pg-boss's send() and insert() of 1000;
//   - the peak resident set size of the worker processes of the lanes
//     workload.
//
// A suite of its own rather than part of peers: it needs this checkout's
// clients/typescript (peers runs from any directory), it builds the
// package, and one runs it alone after changing the TypeScript worker.
// pg-boss runs again here so that every ratio comes from one run.

func init() {
	register(&suite{
		name:  "ts",
		about: "the TypeScript package's work(), send and sendBatch vs pg-boss key_strict_fifo on the same Node.js",
		run:   runTS,
	})
}

// tsConcurrencyDefault is the package's default concurrency (WorkOptions),
// the Go pool's MaxWorkers default.
const tsConcurrencyDefault = pgque.MaxWorkersDefault

// tsConcurrencyLow is the concurrency the lanes case is measured at beside
// the default: the package's default before.
const tsConcurrencyLow = 64

func runTS(ctx context.Context, e *env, r *recorder) error {
	d, err := setupTS(ctx, e)
	if err != nil {
		return err
	}
	boss, err := setupPgBoss(ctx, e)
	if err != nil {
		return err
	}
	boss.describe(e)
	p, client, err := newPgqueClient(ctx, e, "bench_ts", 20)
	if err != nil {
		return err
	}
	defer client.Close()
	nodeNote := fmt.Sprintf("TypeScript package and pg-boss %s on Node.js %s", pgbossVersion, d.node)
	var partial []string // pg-boss drains that ran out of their budget
	withPartial := func(note string) string {
		for _, p := range partial {
			note += "; " + p
		}
		partial = nil
		return note
	}
	bossRun := func(events, tenants, workers, batch int, cost time.Duration, res **pgbossResult) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			dsn, err := e.freshDB(ctx, "bench_ts_pgboss")
			if err != nil {
				return 0, err
			}
			out, err := boss.run(ctx, dsn, events, tenants, workers, batch, cost, pgbossBudget(e))
			if err != nil {
				return 0, err
			}
			if out.TimedOut {
				// As in peers: pg-boss slows down as its backlog grows;
				// its figure is then the rate over the budget.
				partial = append(partial, fmt.Sprintf("pg-boss handled %d of %d jobs in its %s budget: its figure is the rate over the budget", out.Handled, out.Events, pgbossBudget(e)))
			}
			*res = out
			return out.rate(), nil
		}
	}
	var tsCPU []float64 // the free drain's worker CPU per event, µs
	tsRun := func(lr laneRun, concurrency int, rss *[]float64) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			q, events, err := p.loadLanes(ctx, lr)
			if err != nil {
				return 0, err
			}
			stop, err := startTicker(ctx, client, q)
			if err != nil {
				return 0, err
			}
			defer stop()
			out, err := d.work(ctx, p.dsn, q, lr.slots, concurrency, events, lr.cost)
			if err != nil {
				return 0, err
			}
			if rss != nil {
				*rss = append(*rss, out.RSSPeak)
			}
			if lr.cost == 0 {
				tsCPU = append(tsCPU, 1000*out.CPUMS/float64(out.Handled))
			}
			return float64(out.Handled) / (out.WorkMS / 1000), nil
		}
	}

	// Free handler, 8 workers / slots, 1000 tenants.
	bossEvents := pick(e, 2000, 20000)
	free := laneRun{slots: peerWorkers, events: pick(e, 20000, 50000), tenants: tenants}
	var bossFree *pgbossResult
	m, err := e.rounds(ctx, pick(e, 1, 2),
		trial{"pgboss", bossRun(bossEvents, tenants, peerWorkers, 100, 0, &bossFree)},
		trial{"ts", tsRun(free, 0, nil)},
		trial{"go", func(ctx context.Context) (float64, error) { return p.laneRate(ctx, client, free) }},
	)
	if err != nil {
		return err
	}
	r.compare("ts_work_N8_cost0", m["ts"], "pgboss_key_strict_fifo_cost0", m["pgboss"], "events/s", atLeast(20),
		withPartial(fmt.Sprintf("handler cost 0, %d tenants, per-tenant order checked; TypeScript: %d events, work() over 8 slots, default concurrency (%d), Go ticker; pg-boss: %d jobs, 8 workers, batchSize 100; %s",
			tenants, free.events, tsConcurrencyDefault, bossEvents, nodeNote)))
	r.compare("ts_work_N8_cost0", m["ts"], "go_pool_N8_cost0", m["go"], "events/s", nil,
		"the same drain by the Go library's PartitionedConsumer (8 slots, defaults) in the bench process: what the server and the machine allow")
	r.add("ts_work_N8_cost0_cpu", measurement{value: median(tsCPU), samples: tsCPU}, "µs/event", nil,
		"CPU time of the TypeScript worker's Node.js process per event through the free-handler drain (from work() resolving to the last handler's end; a fresh process, so its code is not yet optimised): lower is better")

	// The lanes workload: 200 tenants, 20 ms, 16 workers / slots.
	const lanes, cost = 16, 20 * time.Millisecond
	bossLaneEvents := pick(e, 4000, 8000)
	wide := laneRun{slots: lanes, events: pick(e, 8000, 20000), tenants: laneTenants, cost: cost, maxWorkers: tsConcurrencyDefault}
	narrow := wide
	narrow.maxWorkers = tsConcurrencyLow
	var bossLanes *pgbossResult
	var tsRSS, bossRSS []float64
	m, err = e.rounds(ctx, pick(e, 2, 3),
		trial{"pgboss", func(ctx context.Context) (float64, error) {
			v, err := bossRun(bossLaneEvents, laneTenants, lanes, pgbossLaneBatch, cost, &bossLanes)(ctx)
			if err == nil {
				bossRSS = append(bossRSS, bossLanes.RSSPeak)
			}
			return v, err
		}},
		trial{"ts_default", tsRun(wide, 0, &tsRSS)},
		trial{"ts_low", tsRun(narrow, narrow.maxWorkers, nil)},
		trial{"go", func(ctx context.Context) (float64, error) {
			lr := wide
			lr.maxWorkers = 0
			return p.laneRate(ctx, client, lr)
		}},
	)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("%d tenants, handler 20 ms, per-tenant order checked; TypeScript: %d events, work() over 16 slots, Go ticker; pg-boss: %d jobs, 16 workers (localConcurrency 16, batchSize %d); %s",
		laneTenants, wide.events, bossLaneEvents, pgbossLaneBatch, nodeNote)
	note = withPartial(note)
	for _, c := range []struct {
		name string
		lr   laneRun
		t    *target
	}{{"ts_default", wide, atLeast(10)}, {"ts_low", narrow, nil}} {
		ideal := c.lr.ideal()
		cse := fmt.Sprintf("ts_work_N16_c%d_cost20ms", c.lr.maxWorkers)
		cnote := fmt.Sprintf("%s; concurrency %d; ideal %s ev/s (min(tenants, concurrency) × 50/s): %.0f%% of it", note, c.lr.maxWorkers, fmtNum(ideal), 100*m[c.name].value/ideal)
		r.compare(cse, m[c.name], "pgboss_16w_cost20ms", m["pgboss"], "events/s", c.t, cnote)
		r.add(cse+"_vs_ideal", measurement{value: m[c.name].value / ideal}, "ratio", valueAtLeast(0.7), cnote)
	}
	r.compare("ts_work_N16_c256_cost20ms", m["ts_default"], "go_pool_N16_cost20ms", m["go"], "events/s", nil,
		fmt.Sprintf("the same drain by the Go library's PartitionedConsumer (16 slots, MaxWorkers %d) in the bench process; it reached %.0f%% of the ideal", pgque.MaxWorkersDefault, 100*m["go"].value/wide.ideal()))
	r.compare("ts_worker_rss_N16", measurement{value: median(tsRSS), samples: tsRSS}, "pgboss_worker_rss_16w", measurement{value: median(bossRSS), samples: bossRSS}, "bytes", nil,
		"peak resident set size of the Node.js process while it drained the lanes workload (lower is better): TypeScript work() over 16 slots at the default concurrency, 256 (it only works: the Go side loaded its backlog); pg-boss 16 workers (its process loaded its jobs before the drain)")

	// Sends: 1000 tenants, a partition key / singletonKey each.
	sendEvents, bossSendEvents := pick(e, 5000, 20000), pick(e, 2000, 5000)
	oneEvents := pick(e, 1000, 3000)
	batchEvents, insertEvents := pick(e, 20000, 100000), pick(e, 5000, 20000)
	bossSend := func(events, callers, batch int) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			dsn, err := e.freshDB(ctx, "bench_ts_pgboss")
			if err != nil {
				return 0, err
			}
			return boss.sendRate(ctx, dsn, events, tenants, callers, batch)
		}
	}
	tsSend := func(events, callers, batch int) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return d.sendRate(ctx, p.dsn, pgqueQueue, events, tenants, callers, batch)
		}
	}
	m, err = e.rounds(ctx, pick(e, 2, 3),
		trial{"ts_send_c16", tsSend(sendEvents, 16, 0)},
		trial{"pgboss_send_c16", bossSend(bossSendEvents, 16, 0)},
		trial{"ts_send_c1", tsSend(oneEvents, 1, 0)},
		trial{"pgboss_send_c1", bossSend(oneEvents, 1, 0)},
		trial{"ts_send_batch", tsSend(batchEvents, 1, batchSize)},
		trial{"pgboss_insert", bossSend(insertEvents, 1, batchSize)},
	)
	if err != nil {
		return err
	}
	r.compare("ts_send_c16", m["ts_send_c16"], "pgboss_send_c16", m["pgboss_send_c16"], "events/s", atLeast(2),
		fmt.Sprintf("16 concurrent callers of send() on a pg.Pool of 20 (the package coalesces concurrent sends), a partition key each; pg-boss: send() with a singletonKey on key_strict_fifo, 16 callers, pool of 20; %d and %d events; %s", sendEvents, bossSendEvents, nodeNote))
	// One caller waits out a round trip per send on either side: no
	// coalescing to win by, so no target.
	r.compare("ts_send_c1", m["ts_send_c1"], "pgboss_send_c1", m["pgboss_send_c1"], "events/s", nil,
		fmt.Sprintf("one caller, one send() after another (a round trip each), %d events each; %s", oneEvents, nodeNote))
	r.compare("ts_send_batch", m["ts_send_batch"], "pgboss_insert", m["pgboss_insert"], "events/s", atLeast(2),
		fmt.Sprintf("sendBatch() of %d events with partition keys vs pg-boss insert() of %d jobs with singletonKeys, one call after another; %d and %d events; %s", batchSize, batchSize, batchEvents, insertEvents, nodeNote))
	return nil
}
