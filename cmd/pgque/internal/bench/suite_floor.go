package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The physical floor: what a plain INSERT and SELECT cost on a table shaped
// exactly like a pgque event table (sql/engine/structure/tables.sql,
// pgque.event: same columns, defaults, and the one btree index on
// (ev_txid, ev_id)),
// but a plain heap table instead of a partition of pgque.event. Nothing can
// append an event more cheaply than this, so the produce suite reports
// pgque's send as a fraction of it.

func init() {
	register(&suite{
		name:  "floor",
		about: "raw INSERT / INSERT...SELECT / SELECT on a table shaped like a pgque event table",
		run:   runFloor,
	})
}

// floorDDL creates schema bench_floor with the event-shaped table. The
// produce suite checks that its columns still match pgque.event. It has
// ev_dedup but not pgque.event's partial index on it: a send without a
// dedup key pays that index's predicate, which is part of what is measured.
const floorDDL = `
create schema if not exists bench_floor;
create sequence if not exists bench_floor.event_seq;
create table if not exists bench_floor.event (
    ev_id     bigint not null,
    ev_time   timestamptz not null default now(),
    ev_txid   xid8 not null default pg_current_xact_id(),
    ev_part   integer not null,
    ev_owner  integer,
    ev_retry  integer,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text,
    ev_dedup  text
);
create index if not exists event_txid_id_idx on bench_floor.event (ev_txid, ev_id);`

const (
	floorInsertSQL = `insert into bench_floor.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
values (nextval('bench_floor.event_seq'), 16, $1, $2, $3)`
	floorInsertSelectSQL = `insert into bench_floor.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
select nextval('bench_floor.event_seq'), 16, $1, p, k from unnest($2::text[], $3::text[]) as u(p, k)`
	floorSelectSQL = `select ev_id, ev_time, ev_txid::text, ev_retry, ev_type, ev_data,
       ev_extra1, ev_extra2, ev_extra3, ev_extra4
  from bench_floor.event where ev_txid = $1::text::xid8 order by ev_id`
)

// floor holds the floor's operations on one database.
type floor struct {
	pool *pgxpool.Pool
	next atomic.Int64 // index of the next single-row event's payload
}

// newFloor creates the floor table in the database pool points at.
func newFloor(ctx context.Context, pool *pgxpool.Pool) (*floor, error) {
	if _, err := pool.Exec(ctx, floorDDL); err != nil {
		return nil, fmt.Errorf("creating the floor table: %w", err)
	}
	return &floor{pool: pool}, nil
}

func (f *floor) truncate(ctx context.Context) error {
	_, err := f.pool.Exec(ctx, "truncate bench_floor.event")
	return err
}

// insertRate measures single-row INSERT, one per transaction, on conns
// connections for d; rows per second.
func (f *floor) insertRate(ctx context.Context, conns int, d time.Duration) (float64, error) {
	if err := f.truncate(ctx); err != nil {
		return 0, err
	}
	return connLoop(ctx, f.pool, conns, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		i := int(f.next.Add(1))
		_, err := c.Exec(ctx, floorInsertSQL, eventType, payload(i), tenantKey(i))
		return 1, err
	})
}

// insertSelectRate measures INSERT ... SELECT of batchSize client-supplied
// rows per statement (the shape of send_batch); rows per second.
func (f *floor) insertSelectRate(ctx context.Context, d time.Duration) (float64, error) {
	if err := f.truncate(ctx); err != nil {
		return 0, err
	}
	payloads, keys := batchPayloads(0, batchSize)
	return connLoop(ctx, f.pool, 1, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		_, err := c.Exec(ctx, floorInsertSelectSQL, eventType, payloads, keys)
		return batchSize, err
	})
}

// loadForSelect fills the table with n transactions of batchSize rows each
// and returns their transaction ids.
func (f *floor) loadForSelect(ctx context.Context, n int) ([]string, error) {
	if err := f.truncate(ctx); err != nil {
		return nil, err
	}
	payloads, keys := batchPayloads(0, batchSize)
	var txids []string
	for range n {
		var txid string
		err := pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, floorInsertSelectSQL, eventType, payloads, keys); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "select pg_current_xact_id()::text").Scan(&txid)
		})
		if err != nil {
			return nil, fmt.Errorf("loading the floor table: %w", err)
		}
		txids = append(txids, txid)
	}
	if _, err := f.pool.Exec(ctx, "vacuum analyze bench_floor.event"); err != nil {
		return nil, err
	}
	return txids, nil
}

// selectRate measures reading the batchSize rows of one transaction through
// the ev_txid index, returning every column to the client (the shape of
// get_batch_events); rows per second.
func (f *floor) selectRate(ctx context.Context, txids []string, d time.Duration) (float64, error) {
	i := 0
	return connLoop(ctx, f.pool, 1, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		i++
		return drainRows(c.Query(ctx, floorSelectSQL, txids[i%len(txids)]))
	})
}

// drainRows reads every row of a result, decoding each value as the client
// would, and returns the row count.
func drainRows(rows pgx.Rows, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	n := 0
	for rows.Next() {
		if _, err := rows.Values(); err != nil {
			rows.Close()
			return n, err
		}
		n++
	}
	rows.Close()
	return n, rows.Err()
}

func runFloor(ctx context.Context, e *env, r *recorder) error {
	dsn, err := e.freshDB(ctx, "bench_floor")
	if err != nil {
		return err
	}
	pool, err := e.pool(ctx, dsn, 20)
	if err != nil {
		return err
	}
	defer pool.Close()
	f, err := newFloor(ctx, pool)
	if err != nil {
		return err
	}
	d := pick(e, 500*time.Millisecond, 3*time.Second)
	n := pick(e, 3, 5)
	m, err := e.rounds(ctx, n,
		trial{"insert_1conn", func(ctx context.Context) (float64, error) { return f.insertRate(ctx, 1, d) }},
		trial{"insert_16conn", func(ctx context.Context) (float64, error) { return f.insertRate(ctx, 16, d) }},
		trial{"insert_select_1000", func(ctx context.Context) (float64, error) { return f.insertSelectRate(ctx, d) }},
	)
	if err != nil {
		return err
	}
	r.add("insert_1conn", m["insert_1conn"], "rows/s", nil, "one INSERT per transaction")
	r.add("insert_16conn", m["insert_16conn"], "rows/s", nil, "one INSERT per transaction, 16 connections")
	r.compare("insert_16conn", m["insert_16conn"], "insert_1conn", m["insert_1conn"], "rows/s", nil, "scaling from 1 to 16 connections")
	r.add("insert_select_1000", m["insert_select_1000"], "rows/s", nil, "INSERT ... SELECT from unnest of 1000 client-supplied rows")

	txids, err := f.loadForSelect(ctx, pick(e, 20, 100))
	if err != nil {
		return err
	}
	sm, err := e.rounds(ctx, n,
		trial{"select_1000", func(ctx context.Context) (float64, error) { return f.selectRate(ctx, txids, d) }})
	if err != nil {
		return err
	}
	r.add("select_1000", sm["select_1000"], "rows/s", nil, "SELECT of one transaction's 1000 rows via the ev_txid index")
	return nil
}
