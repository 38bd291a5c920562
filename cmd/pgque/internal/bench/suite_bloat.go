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
	"github.com/jackc/pgx/v5/pgxpool"
)

// Bloat: dead tuples and table sizes after a long send/consume run, once
// normally and once with a REPEATABLE READ transaction holding the xmin
// horizon for the whole run (a long analytics query), when nothing can be
// vacuumed. Event tables must have no dead tuples at all (append-only,
// reclaimed by TRUNCATE); metadata (tick, subscription, progress, leases)
// must stay bounded even when the horizon is held, or every call slows down
// as it wades through dead versions. The one row updated in place while
// consuming is the queue's, by rotation (once per rotation_period): it is
// counted per rotation, apart from the per-batch state.
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

// bloatPass is one database's run: its state and what it measured.
type bloatPass struct {
	name    string
	held    bool
	steps   int
	conn    *pgxpool.Conn
	c       *pgx.Conn
	tokens  []string // the lease token of each slot
	holdTx  pgx.Tx   // the REPEATABLE READ transaction holding xmin, or nil
	cleanup []func()

	events       int
	elapsed      time.Duration // time spent in steps only
	final        map[string]tableStat
	maxEventDead int64
	maxMetaDead  int64
	midMetaDead  int64 // metadata dead tuples halfway through, the queue row's excluded
	sampled      bool
	queueDead0   int64 // the queue row's dead versions at the first sample
	curTable     int   // the queue's current event table, as last read
	rotations    int   // rotations maint() made during the run
}

const (
	bloatPlain  = "plain"
	bloatPart   = "part"
	bloatWorker = "w1"
	bloatSlots  = 4
)

// newBloatPass creates the pass's database, queue and subscriptions and,
// when held, opens the transaction that holds the xmin horizon.
func newBloatPass(ctx context.Context, e *env, held bool, steps int) (*bloatPass, error) {
	b := &bloatPass{name: "bench_bloat", held: held, steps: steps}
	if held {
		b.name = "bench_bloat_held"
	}
	p, err := newPgque(ctx, e, b.name, 4)
	if err != nil {
		return nil, err
	}
	b.cleanup = append(b.cleanup, p.pool.Close)
	if b.conn, err = p.pool.Acquire(ctx); err != nil {
		b.close()
		return nil, err
	}
	b.cleanup = append(b.cleanup, b.conn.Release)
	b.c = b.conn.Conn()
	for _, s := range []string{
		"select pgque.set_queue_config('bench', 'rotation_period', '2 seconds')",
		"select pgque.subscribe('bench', 'plain')",
	} {
		if _, err := b.c.Exec(ctx, s); err != nil {
			b.close()
			return nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	if b.tokens, err = subscribeSlots(ctx, b.c, pgqueQueue, bloatPart, bloatSlots, bloatWorker); err != nil {
		b.close()
		return nil, err
	}
	if held {
		hold, err := p.pool.Acquire(ctx)
		if err != nil {
			b.close()
			return nil, err
		}
		tx, err := hold.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			hold.Release()
			b.close()
			return nil, err
		}
		b.cleanup = append(b.cleanup, func() {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			hold.Release()
		})
		// The snapshot, and with it the held xmin, is taken by the first
		// statement.
		if _, err := tx.Exec(ctx, "select count(*) from pgque.queue"); err != nil {
			b.close()
			return nil, err
		}
		b.holdTx = tx
	}
	return b, nil
}

func (b *bloatPass) close() {
	for i := len(b.cleanup) - 1; i >= 0; i-- {
		b.cleanup[i]()
	}
	b.cleanup = nil
}

// step sends one batch, ticks, lets both consumers drain it and runs
// maint() every 10 steps. Only this is timed.
func (b *bloatPass) step(ctx context.Context, i int) error {
	start := time.Now()
	if err := sendAndTick(ctx, b.c, pgqueQueue, i*batchSize); err != nil {
		return err
	}
	if _, err := drainPlain(ctx, b.c, pgqueQueue, bloatPlain); err != nil {
		return err
	}
	for k := range bloatSlots {
		if _, err := drainSlot(ctx, b.c, pgqueQueue, bloatPart, k, bloatSlots, bloatWorker, b.tokens[k]); err != nil {
			return err
		}
	}
	if i%10 == 9 {
		if _, err := b.c.Exec(ctx, "select pgque.maint()"); err != nil {
			return fmt.Errorf("maint: %w", err)
		}
	}
	b.elapsed += time.Since(start)
	b.events += batchSize
	if i%10 == 9 {
		// Untimed: one maint() rotates at most once, so a changed current
		// table is one rotation.
		var cur int
		if err := b.c.QueryRow(ctx, "select queue_cur_table from pgque.queue where queue_name = $1", pgqueQueue).Scan(&cur); err != nil {
			return fmt.Errorf("reading the current table: %w", err)
		}
		if cur != b.curTable {
			b.rotations++
			b.curTable = cur
		}
	}
	if i%50 == 0 || i == b.steps/2 {
		return b.sample(ctx, i)
	}
	return nil
}

// sample reads the table statistics and keeps the maxima.
func (b *bloatPass) sample(ctx context.Context, i int) error {
	st, err := tableStats(ctx, b.c)
	if err != nil {
		return err
	}
	b.maxEventDead = max(b.maxEventDead, st["event tables"].dead)
	md := metadata(st).dead
	b.maxMetaDead = max(b.maxMetaDead, md)
	if !b.sampled {
		b.sampled = true
		b.queueDead0 = st["queue"].dead
	}
	if i == b.steps/2 {
		b.midMetaDead = md - st["queue"].dead
	}
	b.final = st
	return nil
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
	var passes []*bloatPass
	defer func() {
		for _, b := range passes {
			b.close()
		}
	}()
	for _, held := range []bool{false, true} {
		b, err := newBloatPass(ctx, e, held, steps)
		if err != nil {
			return err
		}
		passes = append(passes, b)
	}
	e.logf("   %d events into each of two databases, one step each in turn; the second holds the xmin horizon", steps*batchSize)
	lastLog := time.Now()
	for i := range steps {
		for _, b := range passes {
			if err := b.step(ctx, i); err != nil {
				return fmt.Errorf("%s: %w", b.name, err)
			}
		}
		if time.Since(lastLog) > 10*time.Second {
			e.logf("   %d/%d events", (i+1)*batchSize, steps*batchSize)
			lastLog = time.Now()
		}
	}
	for _, b := range passes {
		if err := b.sample(ctx, steps); err != nil {
			return err
		}
		suffix := ""
		if b.held {
			suffix = "_held_xmin"
		}
		ev, meta := b.final["event tables"], metadata(b.final)
		r.add("event_dead_tuples"+suffix, single(float64(b.maxEventDead)), "dead tuples", valueAtMost(0),
			fmt.Sprintf("max over the run, all event tables; %d updates, %d deletes", ev.upd, ev.del))
		r.add("metadata_dead_tuples_max"+suffix, single(float64(b.maxMetaDead)), "dead tuples", nil,
			"max over the run; at the end: "+breakdown(b.final))
		r.add("metadata_dead_tuples_end"+suffix, single(float64(meta.dead)), "dead tuples", nil,
			fmt.Sprintf("%d metadata updates (%d HOT) and %d deletes for %d events", meta.upd, meta.hotUpd, meta.del, b.events))
		if b.held {
			// Per-batch state is judged without the queue row, which
			// rotation updates once per rotation_period (2 s here, 2 hours
			// by default): its versions grow with time, not with batches,
			// and are counted per rotation below.
			perBatch := meta.dead - b.final["queue"].dead
			growth := 0.0
			if b.midMetaDead > 0 {
				growth = float64(perBatch) / float64(b.midMetaDead)
			} else if perBatch == 0 {
				growth = 1
			}
			r.add("metadata_dead_growth"+suffix, single(growth), "end/mid", valueAtMost(1.25),
				fmt.Sprintf("metadata dead tuples but the queue row's at the end (%d) over halfway (%d): 2 means they grow with every event (unbounded), about 1 bounded",
					perBatch, b.midMetaDead))
			if b.rotations > 0 {
				qd := b.final["queue"].dead - b.queueDead0
				r.add("queue_dead_per_rotation"+suffix, single(float64(qd)/float64(b.rotations)), "versions/rotation", valueAtMost(1),
					fmt.Sprintf("dead versions of the queue row made during the run (%d) over the rotations (%d): rotation updates the row once; nothing else does while consuming",
						qd, b.rotations))
			}
		}
		r.add("event_tables_size"+suffix, single(float64(ev.bytes)), "bytes", nil, "after the run (rotation truncates consumed tables)")
		r.add("metadata_size"+suffix, single(float64(meta.bytes)), "bytes", nil, "")
	}
	rate := func(b *bloatPass) float64 { return float64(b.events) / b.elapsed.Seconds() }
	r.compare("loop_throughput_held_xmin", single(rate(passes[1])), "loop_throughput", single(rate(passes[0])), "events/s", nil,
		"send+tick+consume loop speed with the xmin horizon held vs not, steps interleaved: below 1 means dead metadata slows every call")
	return nil
}
