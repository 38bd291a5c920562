package bench

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bloat: dead tuples and table sizes after a long send/consume run, once
// normally and once with a REPEATABLE READ transaction holding the xmin
// horizon for the whole run (a long analytics query), when nothing can be
// vacuumed. Event tables must have no dead tuples at all (append-only,
// reclaimed by TRUNCATE); metadata (tick, subscription, progress, leases)
// must stay bounded even when the horizon is held, or every call slows down
// as it wades through dead versions.
//
// The run is one deterministic loop on one connection: send_batch of 1000,
// a tick, then a plain consumer and a 4-slot partitioned consumer each drain
// what is new (receive/ack and receive_partitioned/ack_partitioned), and
// maint() every 10 ticks, with rotation_period 2 s so tables rotate several
// times. Autovacuum runs as it would in production; besides n_dead_tup
// (which autovacuum lowers), the suite reports n_tup_upd and n_tup_del,
// which count the churn whenever vacuum runs.

func init() {
	register(&suite{
		name:  "bloat",
		about: "dead tuples and sizes of event and metadata tables after 1M events (100k quick), with and without a held xmin",
		run:   runBloat,
	})
}

var eventTableRE = regexp.MustCompile(`^event_[0-9]+_[0-9]+$`)

// tableStat is one pgque table's counters.
type tableStat struct {
	dead, upd, hotUpd, del, bytes int64
}

// tableStats flushes this backend's statistics and returns pgque's tables'
// counters, event partitions summed under "event tables".
func tableStats(ctx context.Context, c *pgx.Conn) (map[string]tableStat, error) {
	if _, err := c.Exec(ctx, "select pg_stat_force_next_flush()"); err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, `select relname, n_dead_tup, n_tup_upd, n_tup_hot_upd, n_tup_del,
	       pg_total_relation_size(relid) from pg_stat_user_tables where schemaname = 'pgque'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]tableStat{}
	for rows.Next() {
		var name string
		var s tableStat
		if err := rows.Scan(&name, &s.dead, &s.upd, &s.hotUpd, &s.del, &s.bytes); err != nil {
			return nil, err
		}
		if eventTableRE.MatchString(name) {
			name = "event tables"
		}
		t := out[name]
		out[name] = tableStat{t.dead + s.dead, t.upd + s.upd, t.hotUpd + s.hotUpd, t.del + s.del, t.bytes + s.bytes}
	}
	return out, rows.Err()
}

// metadata sums every table but the event tables.
func metadata(m map[string]tableStat) tableStat {
	var t tableStat
	for name, s := range m {
		if name == "event tables" {
			continue
		}
		t = tableStat{t.dead + s.dead, t.upd + s.upd, t.hotUpd + s.hotUpd, t.del + s.del, t.bytes + s.bytes}
	}
	return t
}

// bloatPass is what one run measured.
type bloatPass struct {
	events       int
	elapsed      time.Duration
	final        map[string]tableStat
	maxEventDead int64
	maxMetaDead  int64
	midMetaDead  int64 // metadata dead tuples halfway through
	rotations    int64
}

func bloatRun(ctx context.Context, e *env, held bool, steps int) (*bloatPass, error) {
	name := "bench_bloat"
	if held {
		name = "bench_bloat_held"
	}
	p, err := newPgque(ctx, e, name, 4)
	if err != nil {
		return nil, err
	}
	defer p.pool.Close()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	c := conn.Conn()
	const q, plain, part, worker, nslots = "bench", "plain", "part", "w1", 4
	for _, s := range []string{
		"select pgque.set_queue_config('bench', 'rotation_period', '2 seconds')",
		"select pgque.subscribe('bench', 'plain')",
	} {
		if _, err := c.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	if err := subscribeSlots(ctx, c, q, part, nslots, worker); err != nil {
		return nil, err
	}
	if held {
		hold, err := p.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer hold.Release()
		tx, err := hold.Begin(ctx)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if _, err := tx.Exec(ctx, "set transaction isolation level repeatable read"); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, "select count(*) from pgque.queue"); err != nil {
			return nil, err
		}
	}
	res := &bloatPass{events: steps * batchSize}
	start := time.Now()
	lastLog := time.Now()
	sample := func(step int) error {
		st, err := tableStats(ctx, c)
		if err != nil {
			return err
		}
		res.maxEventDead = max(res.maxEventDead, st["event tables"].dead)
		md := metadata(st).dead
		res.maxMetaDead = max(res.maxMetaDead, md)
		if step == steps/2 {
			res.midMetaDead = md
		}
		res.final = st
		return nil
	}
	for step := range steps {
		if err := sendAndTick(ctx, c, q, step*batchSize); err != nil {
			return nil, err
		}
		if _, err := drainPlain(ctx, c, q, plain); err != nil {
			return nil, err
		}
		for k := range nslots {
			if _, err := drainSlot(ctx, c, q, part, k, nslots, worker); err != nil {
				return nil, err
			}
		}
		if step%10 == 9 {
			var ops int64
			if err := c.QueryRow(ctx, "select pgque.maint()").Scan(&ops); err != nil {
				return nil, fmt.Errorf("maint: %w", err)
			}
		}
		if step%50 == 0 || step == steps/2 {
			if err := sample(step); err != nil {
				return nil, err
			}
		}
		if time.Since(lastLog) > 10*time.Second {
			e.logf("   %s: %d/%d events", name, (step+1)*batchSize, steps*batchSize)
			lastLog = time.Now()
		}
	}
	res.elapsed = time.Since(start)
	if err := sample(steps); err != nil {
		return nil, err
	}
	return res, nil
}

// breakdown lists the tables with dead tuples and their sizes.
func breakdown(m map[string]tableStat) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(m)) {
		s := m[name]
		if s.dead == 0 && s.upd == 0 && s.del == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %d dead, %d upd (%d HOT), %d del, %s",
			name, s.dead, s.upd, s.hotUpd, s.del, fmtBytes(s.bytes)))
	}
	return strings.Join(parts, "; ")
}

func fmtBytes(b int64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0f kB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%d B", b)
	}
}

func runBloat(ctx context.Context, e *env, r *recorder) error {
	steps := pick(e, 100, 1000)
	passes := map[bool]*bloatPass{}
	for _, held := range []bool{false, true} {
		e.logf("   %d events, xmin held: %v", steps*batchSize, held)
		p, err := bloatRun(ctx, e, held, steps)
		if err != nil {
			return err
		}
		passes[held] = p
		suffix := ""
		if held {
			suffix = "_held_xmin"
		}
		ev, meta := p.final["event tables"], metadata(p.final)
		r.add("event_dead_tuples"+suffix, single(float64(p.maxEventDead)), "dead tuples", valueAtMost(0),
			fmt.Sprintf("max over the run, all event tables; %d updates, %d deletes", ev.upd, ev.del))
		r.add("metadata_dead_tuples_max"+suffix, single(float64(p.maxMetaDead)), "dead tuples", nil,
			"max over the run: "+breakdown(p.final))
		r.add("metadata_dead_tuples_end"+suffix, single(float64(meta.dead)), "dead tuples", nil,
			fmt.Sprintf("%d metadata updates (%d HOT) and %d deletes for %d events", meta.upd, meta.hotUpd, meta.del, p.events))
		if held {
			growth := 0.0
			if p.midMetaDead > 0 {
				growth = float64(meta.dead) / float64(p.midMetaDead)
			} else if meta.dead == 0 {
				growth = 1
			}
			r.add("metadata_dead_growth_2nd_half"+suffix, single(growth), "end/mid", valueAtMost(1.25),
				fmt.Sprintf("metadata dead tuples at the end (%d) over halfway (%d): 2 means they grow with every event (unbounded), ~1 bounded",
					meta.dead, p.midMetaDead))
		}
		r.add("event_tables_size"+suffix, single(float64(ev.bytes)), "bytes", nil, "after the run (rotation truncates consumed tables)")
		r.add("metadata_size"+suffix, single(float64(meta.bytes)), "bytes", nil, "")
	}
	plainRate := float64(passes[false].events) / passes[false].elapsed.Seconds()
	heldRate := float64(passes[true].events) / passes[true].elapsed.Seconds()
	r.compare("loop_throughput_held_xmin", single(heldRate), "loop_throughput", single(plainRate), "events/s", nil,
		"send+tick+consume loop speed with the xmin horizon held vs not: below 1 means dead metadata slows every call")
	return nil
}
