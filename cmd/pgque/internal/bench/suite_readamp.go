package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
)

// Read amplification: how many event-table rows (and buffers) the database
// reads per event it delivers, as the slot count N grows. A partitioned
// consumer whose slots each scan the whole batch and throw away the other
// slots' events reads N rows per delivered event, and one that rescans the
// batch for every chunk reads (events per slot per batch / chunk size) times
// more; the target is at most 2 at N = 16. The consumer receives in chunks
// of the Go client's default size (100), as users do; one extra mode uses
// chunks as large as the batches (1000). Quick runs measure N = 1, 4, 16.
//
// Rows read come from pg_stat_user_tables (seq_tup_read + idx_tup_fetch:
// heap tuples fetched, before any filter), buffers from
// pg_statio_user_tables (heap, index and TOAST blocks hit or read), both as
// deltas around the consumers' calls only, with the consuming backend's
// statistics flushed first (pg_stat_force_next_flush), so the figures are
// exact and untouched by the producer and the ticker.

func init() {
	register(&suite{
		name:  "readamp",
		about: "rows and buffers read per delivered event vs slot count N: steady, during rotation, with one stalled slot",
		run:   runReadAmp,
	})
}

var readAmpSlots = []int{1, 2, 4, 8, 16}

// readCounters are cumulative read counters of pgque's tables.
type readCounters struct {
	eventRows, otherRows, buffers int64
}

func (a readCounters) sub(b readCounters) readCounters {
	return readCounters{a.eventRows - b.eventRows, a.otherRows - b.otherRows, a.buffers - b.buffers}
}

func (a readCounters) add(b readCounters) readCounters {
	return readCounters{a.eventRows + b.eventRows, a.otherRows + b.otherRows, a.buffers + b.buffers}
}

// readStats flushes this backend's pending statistics and reads pgque's
// table counters. The flush happens when the backend goes idle after the
// first statement, before it answers, so the second statement sees it.
func readStats(ctx context.Context, c *pgx.Conn) (readCounters, error) {
	var rc readCounters
	if _, err := c.Exec(ctx, "select pg_stat_force_next_flush()"); err != nil {
		return rc, fmt.Errorf("flushing statistics: %w", err)
	}
	err := c.QueryRow(ctx, `
select coalesce(sum(coalesce(t.seq_tup_read, 0) + coalesce(t.idx_tup_fetch, 0))
                filter (where t.relname ~ '^event_[0-9]+_[0-9]+$'), 0)::bigint,
       coalesce(sum(coalesce(t.seq_tup_read, 0) + coalesce(t.idx_tup_fetch, 0))
                filter (where t.relname !~ '^event_[0-9]+_[0-9]+$'), 0)::bigint,
       coalesce(sum(coalesce(s.heap_blks_read, 0) + coalesce(s.heap_blks_hit, 0)
                  + coalesce(s.idx_blks_read, 0) + coalesce(s.idx_blks_hit, 0)
                  + coalesce(s.toast_blks_read, 0) + coalesce(s.toast_blks_hit, 0)
                  + coalesce(s.tidx_blks_read, 0) + coalesce(s.tidx_blks_hit, 0)), 0)::bigint
  from pg_stat_user_tables t join pg_statio_user_tables s using (relid)
 where t.schemaname = 'pgque'`).Scan(&rc.eventRows, &rc.otherRows, &rc.buffers)
	if err != nil {
		return rc, fmt.Errorf("reading table statistics: %w", err)
	}
	return rc, nil
}

// readAmpMode is one scenario of the suite.
type readAmpMode struct {
	name     string
	chunk    int  // receive_partitioned max
	rotate   bool // rotation_period 10 ms and maint() after every tick
	stalled  bool // the last slot is claimed but never polled
	minSlots int
}

var readAmpModes = []readAmpMode{
	{name: "steady", chunk: pgque.BatchSizeDefault, minSlots: 1},
	{name: "rotation", chunk: pgque.BatchSizeDefault, rotate: true, minSlots: 1},
	{name: "stalled_slot", chunk: pgque.BatchSizeDefault, rotate: true, stalled: true, minSlots: 2},
	{name: "steady_chunk1000", chunk: batchSize, minSlots: 1},
}

// readAmpResult is what one scenario measured.
type readAmpResult struct {
	delivered int64
	reads     readCounters
	maintOps  int64
}

// runReadAmpScenario produces steps batches into a fresh queue, one tick
// each, and after every tick drains each polled slot of an nslots consumer
// on one connection, counting reads around the drains.
func runReadAmpScenario(ctx context.Context, p *pgqueDB, mode readAmpMode, nslots, steps int) (readAmpResult, error) {
	var res readAmpResult
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Release()
	c := conn.Conn()
	q := p.fresh("ra_")
	if _, err := c.Exec(ctx, "select pgque.create_queue($1)", q); err != nil {
		return res, err
	}
	if mode.rotate {
		if _, err := c.Exec(ctx, "select pgque.set_queue_config($1, 'rotation_period', '10 milliseconds')", q); err != nil {
			return res, err
		}
	}
	const consumer, worker = "amp", "w1"
	tokens, err := subscribeSlots(ctx, c, q, consumer, nslots, worker)
	if err != nil {
		return res, err
	}
	polled := nslots
	if mode.stalled {
		polled = nslots - 1
	}
	for step := range steps {
		if err := sendAndTick(ctx, c, q, step*batchSize); err != nil {
			return res, err
		}
		if mode.rotate {
			var ops int64
			if err := c.QueryRow(ctx, "select pgque.maint()").Scan(&ops); err != nil {
				return res, fmt.Errorf("maint: %w", err)
			}
			res.maintOps += ops
		}
		before, err := readStats(ctx, c)
		if err != nil {
			return res, err
		}
		for k := range polled {
			n, err := drainSlotChunks(ctx, c, q, consumer, k, nslots, worker, tokens[k], mode.chunk)
			if err != nil {
				return res, err
			}
			res.delivered += int64(n)
		}
		after, err := readStats(ctx, c)
		if err != nil {
			return res, err
		}
		res.reads = res.reads.add(after.sub(before))
	}
	want := int64(steps * batchSize)
	if !mode.stalled && res.delivered != want {
		return res, fmt.Errorf("%s N=%d: delivered %d events, sent %d", mode.name, nslots, res.delivered, want)
	}
	return res, nil
}

func runReadAmp(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgque(ctx, e, "bench_readamp", 4)
	if err != nil {
		return err
	}
	steps := pick(e, 4, 30)
	for _, mode := range readAmpModes {
		for _, n := range readAmpSlots {
			if n < mode.minSlots || (e.quick && n != 1 && n != 4 && n != 16) {
				continue
			}
			res, err := runReadAmpScenario(ctx, p, mode, n, steps)
			if err != nil {
				return err
			}
			if res.delivered == 0 {
				return fmt.Errorf("%s N=%d: nothing delivered", mode.name, n)
			}
			d := float64(res.delivered)
			cse := fmt.Sprintf("%s_N%d", mode.name, n)
			var t *target
			if n == 16 && mode.chunk == pgque.BatchSizeDefault {
				t = valueAtMost(2)
			}
			notes := []string{fmt.Sprintf("%d events delivered over %d ticks of %d, in chunks of at most %d", res.delivered, steps, batchSize, mode.chunk),
				fmt.Sprintf("all other pgque tables: %.2f rows/event", float64(res.reads.otherRows)/d)}
			if mode.rotate {
				notes = append(notes, fmt.Sprintf("maint() did %d operations", res.maintOps))
			}
			if mode.stalled {
				notes = append(notes, fmt.Sprintf("slot %d/%d claimed but never polled", n-1, n))
			}
			r.add(cse, single(float64(res.reads.eventRows)/d), "event rows/event", t, strings.Join(notes, "; "))
			r.add(cse, single(float64(res.reads.buffers)/d), "buffers/event", nil, "heap+index+TOAST blocks of pgque tables, hit or read")
		}
	}
	return nil
}
