package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PgQ, the C extension pgque restates in SQL, in its own database on the
// same cluster. Its producer and batch read path are the references for
// pgque's engine: pgque may not be much slower than the original, and its
// API (send, receive/ack) should beat it where it does less work per event.

func init() {
	register(&suite{
		name:  "pgq",
		about: "the PgQ C extension: insert_event single and batched, next_batch/get_batch_events/finish_batch",
		run:   runPgQ,
	})
}

const (
	pgqQueue       = "bench"
	pgqInsertSQL   = `select pgq.insert_event('bench', $1, $2, $3, null, null, null)`
	pgqBatchSQL    = `select pgq.insert_event('bench', $1, p, k, null, null, null) from unnest($2::text[], $3::text[]) as u(p, k)`
	pgqInstallHint = "the PgQ extension is not available on this server; on Debian/Ubuntu install it with " +
		"`apt-get update && apt-get install -y postgresql-15-pgq3` (match your server's major version)"
)

// pgqRef holds PgQ's operations on its own database.
type pgqRef struct {
	pool  *pgxpool.Pool
	next  atomic.Int64
	round int
}

// newPgQ creates database bench_pgq with the pgq extension and a queue.
func newPgQ(ctx context.Context, e *env) (*pgqRef, error) {
	dsn, err := e.freshDB(ctx, "bench_pgq")
	if err != nil {
		return nil, err
	}
	pool, err := e.pool(ctx, dsn, 20)
	if err != nil {
		return nil, err
	}
	var ok bool
	if err := pool.QueryRow(ctx, "select exists (select 1 from pg_available_extensions where name = 'pgq')").Scan(&ok); err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", errSkipped, pgqInstallHint)
	}
	if err := execAll(ctx, dsn,
		"create extension pgq",
		"select pgq.create_queue('bench')",
	); err != nil {
		return nil, fmt.Errorf("setting up PgQ: %w", err)
	}
	return &pgqRef{pool: pool}, nil
}

// optionalPgQ is newPgQ for the suites where PgQ is one reference among
// others: on a server without the extension (Debian packages it for 15
// only) it returns nil, logs that the PgQ cases are left out, and the
// suite measures the rest; withPgQ then drops the PgQ trials and the
// recorder the comparisons with them.
func optionalPgQ(ctx context.Context, e *env) (*pgqRef, error) {
	q, err := newPgQ(ctx, e)
	if errors.Is(err, errSkipped) {
		e.logf("   PgQ cases left out: %v", err)
		return nil, nil
	}
	return q, err
}

// withPgQ returns trials without those named pgq_* when q is nil.
func withPgQ(q *pgqRef, trials ...trial) []trial {
	if q != nil {
		return trials
	}
	return slices.DeleteFunc(trials, func(t trial) bool { return strings.HasPrefix(t.name, "pgq_") })
}

// insertRate measures pgq.insert_event, one per transaction, on conns
// connections; events per second.
func (p *pgqRef) insertRate(ctx context.Context, conns int, d time.Duration) (float64, error) {
	return connLoop(ctx, p.pool, conns, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		i := int(p.next.Add(1))
		_, err := c.Exec(ctx, pgqInsertSQL, eventType, payload(i), tenantKey(i))
		return 1, err
	})
}

// batchRate measures batchSize insert_event calls in one statement over
// client-supplied arrays; events per second.
func (p *pgqRef) batchRate(ctx context.Context, d time.Duration) (float64, error) {
	payloads, keys := batchPayloads(0, batchSize)
	return connLoop(ctx, p.pool, 1, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		_, err := c.Exec(ctx, pgqBatchSQL, eventType, payloads, keys)
		return batchSize, err
	})
}

// readRate builds a backlog of batches ticks of batchSize events in a fresh
// queue, then times one consumer draining it with next_batch,
// get_batch_events (every row to the client) and finish_batch, each in its
// own transaction; events per second.
func (p *pgqRef) readRate(ctx context.Context, batches int) (float64, error) {
	p.round++
	q := "read" + strconv.Itoa(p.round)
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	c := conn.Conn()
	setup := []string{
		fmt.Sprintf("select pgq.create_queue('%s')", q),
		fmt.Sprintf("select pgq.set_queue_config('%s', 'ticker_max_count', '1')", q),
		fmt.Sprintf("select pgq.register_consumer('%s', 'c')", q),
	}
	for _, s := range setup {
		if _, err := c.Exec(ctx, s); err != nil {
			return 0, fmt.Errorf("%s: %w", s, err)
		}
	}
	payloads, keys := batchPayloads(0, batchSize)
	ins := fmt.Sprintf("select pgq.insert_event('%s', $1, p, k, null, null, null) from unnest($2::text[], $3::text[]) as u(p, k)", q)
	for range batches {
		if _, err := c.Exec(ctx, ins, eventType, payloads, keys); err != nil {
			return 0, err
		}
		var tick *int64
		if err := c.QueryRow(ctx, "select pgq.ticker($1)", q).Scan(&tick); err != nil {
			return 0, err
		}
		if tick == nil {
			return 0, fmt.Errorf("pgq.ticker(%s) made no tick after %d events", q, batchSize)
		}
	}
	rate, err := timeIt(ctx, func(ctx context.Context) (int, error) { return pgqDrain(ctx, c, q, "c") })
	if err != nil {
		return 0, err
	}
	for _, s := range []string{
		fmt.Sprintf("select pgq.unregister_consumer('%s', 'c')", q),
		fmt.Sprintf("select pgq.drop_queue('%s')", q),
	} {
		if _, err := c.Exec(ctx, s); err != nil {
			return 0, fmt.Errorf("%s: %w", s, err)
		}
	}
	return rate, nil
}

// pgqDrain consumes every batch available to consumer and returns the number
// of events read.
func pgqDrain(ctx context.Context, c *pgx.Conn, queue, consumer string) (int, error) {
	total := 0
	for {
		var batch *int64
		if err := c.QueryRow(ctx, "select pgq.next_batch($1, $2)", queue, consumer).Scan(&batch); err != nil {
			return total, err
		}
		if batch == nil {
			return total, nil
		}
		n, err := drainRows(c.Query(ctx, "select * from pgq.get_batch_events($1)", *batch))
		if err != nil {
			return total, err
		}
		total += n
		if _, err := c.Exec(ctx, "select pgq.finish_batch($1)", *batch); err != nil {
			return total, err
		}
	}
}

func runPgQ(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgQ(ctx, e)
	if err != nil {
		return err
	}
	f, err := newFloor(ctx, p.pool)
	if err != nil {
		return err
	}
	d := pick(e, 500*time.Millisecond, 3*time.Second)
	n := pick(e, 3, 5)
	// PgQ's cases start from empty event tables, as the floor's do (see
	// the produce suite).
	empty := func(f func(context.Context) (float64, error)) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			if _, err := p.pool.Exec(ctx, "truncate pgq.event_template"); err != nil {
				return 0, err
			}
			return f(ctx)
		}
	}
	m, err := e.rounds(ctx, n,
		trial{"insert_event_1conn", empty(func(ctx context.Context) (float64, error) { return p.insertRate(ctx, 1, d) })},
		trial{"floor_insert_1conn", func(ctx context.Context) (float64, error) { return f.insertRate(ctx, 1, d) }},
		trial{"insert_event_16conn", empty(func(ctx context.Context) (float64, error) { return p.insertRate(ctx, 16, d) })},
		trial{"floor_insert_16conn", func(ctx context.Context) (float64, error) { return f.insertRate(ctx, 16, d) }},
		trial{"insert_event_batch_1000", empty(func(ctx context.Context) (float64, error) { return p.batchRate(ctx, d) })},
		trial{"floor_insert_select_1000", func(ctx context.Context) (float64, error) { return f.insertSelectRate(ctx, d) }},
	)
	if err != nil {
		return err
	}
	r.compare("insert_event_1conn", m["insert_event_1conn"], "floor_insert_1conn", m["floor_insert_1conn"], "events/s", nil, "")
	r.compare("insert_event_16conn", m["insert_event_16conn"], "floor_insert_16conn", m["floor_insert_16conn"], "events/s", nil, "")
	r.compare("insert_event_batch_1000", m["insert_event_batch_1000"], "floor_insert_select_1000", m["floor_insert_select_1000"], "events/s", nil,
		"select pgq.insert_event(...) from unnest of 1000 client-supplied rows, one statement")

	batches := pick(e, 20, 200)
	txids, err := f.loadForSelect(ctx, pick(e, 20, 100))
	if err != nil {
		return err
	}
	rm, err := e.rounds(ctx, n,
		trial{"read_path", func(ctx context.Context) (float64, error) { return p.readRate(ctx, batches) }},
		trial{"floor_select_1000", func(ctx context.Context) (float64, error) { return f.selectRate(ctx, txids, d) }},
	)
	if err != nil {
		return err
	}
	r.compare("read_path", rm["read_path"], "floor_select_1000", rm["floor_select_1000"], "events/s", nil,
		fmt.Sprintf("next_batch + get_batch_events + finish_batch over a backlog of %d ticks x %d events", batches, batchSize))
	return nil
}
