package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/install"
)

// pgqueDB is a fresh database with pgque installed and a queue "bench".
// Its SQL-level operations are the ones the suites time; the Go client is
// driven from the suites that measure it.
type pgqueDB struct {
	dsn  string
	pool *pgxpool.Pool
	next atomic.Int64
	seq  int // names fresh queues and consumers
}

const (
	pgqueQueue        = "bench"
	pgqueSendSQL      = `select pgque.send($1, $2, $3::jsonb, $4)`
	pgqueSendBatchSQL = `select pgque.send_batch('bench', $1, $2::jsonb[], $3::text[])`
	// The text forms, which the Go client uses: the payload goes as the
	// JSON text it already is.
	pgqueSendTextSQL      = `select pgque.send($1, $2, $3::text, $4)`
	pgqueSendBatchTextSQL = `select pgque.send_batch('bench', $1, $2::text[], $3::text[])`
	// The mixed-type form: one type per payload.
	pgqueSendBatchMixedSQL = `select pgque.send_batch('bench', $1::text[], $2::text[], $3::text[])`
)

// newPgque creates database name, installs pgque into it and creates queue
// "bench".
func newPgque(ctx context.Context, e *env, name string, maxConns int) (*pgqueDB, error) {
	dsn, pool, err := e.freshPool(ctx, name, maxConns)
	if err != nil {
		return nil, err
	}
	if _, err := install.Install(ctx, pool); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "select pgque.create_queue($1)", pgqueQueue); err != nil {
		return nil, fmt.Errorf("creating queue: %w", err)
	}
	return &pgqueDB{dsn: dsn, pool: pool}, nil
}

// newPgqueClient is newPgque with a Go client on its pool (its logs
// discarded); the caller closes the client.
func newPgqueClient(ctx context.Context, e *env, name string, maxConns int) (*pgqueDB, *pgque.Client, error) {
	p, err := newPgque(ctx, e, name, maxConns)
	if err != nil {
		return nil, nil, err
	}
	client, err := pgque.NewClient(p.pool, &pgque.Config{Logger: quietLogger})
	if err != nil {
		return nil, nil, err
	}
	return p, client, nil
}

// fresh returns a new unique name with prefix.
func (p *pgqueDB) fresh(prefix string) string {
	p.seq++
	return fmt.Sprintf("%s%d", prefix, p.seq)
}

// sendRate measures pgque.send with a partition key, one per transaction,
// on conns connections; events per second.
func (p *pgqueDB) sendRate(ctx context.Context, conns int, d time.Duration) (float64, error) {
	return p.sendRateTo(ctx, pgqueQueue, conns, d)
}

// sendRateTo is sendRate to another queue.
func (p *pgqueDB) sendRateTo(ctx context.Context, queue string, conns int, d time.Duration) (float64, error) {
	return p.sendRateSQL(ctx, pgqueSendSQL, queue, conns, d)
}

// sendTextRate is sendRate through the text form of send.
func (p *pgqueDB) sendTextRate(ctx context.Context, conns int, d time.Duration) (float64, error) {
	return p.sendRateSQL(ctx, pgqueSendTextSQL, pgqueQueue, conns, d)
}

// sendRateSQL measures sql, called as sql(queue, type, payload, key), one
// per transaction, on conns connections; events per second.
func (p *pgqueDB) sendRateSQL(ctx context.Context, sql, queue string, conns int, d time.Duration) (float64, error) {
	return connLoop(ctx, p.pool, conns, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		i := int(p.next.Add(1))
		_, err := c.Exec(ctx, sql, queue, eventType, payload(i), tenantKey(i))
		return 1, err
	})
}

// sendBatchRate measures pgque.send_batch of batchSize events with
// partition keys; events per second.
func (p *pgqueDB) sendBatchRate(ctx context.Context, d time.Duration) (float64, error) {
	return p.sendBatchRateSQL(ctx, pgqueSendBatchSQL, d, eventType)
}

// sendBatchTextRate is sendBatchRate through the text[] form of send_batch.
func (p *pgqueDB) sendBatchTextRate(ctx context.Context, d time.Duration) (float64, error) {
	return p.sendBatchRateSQL(ctx, pgqueSendBatchTextSQL, d, eventType)
}

// sendBatchMixedRate is sendBatchTextRate through the mixed-type form,
// the events' types cycling through those of a file's life, so that no
// two neighbours share one.
func (p *pgqueDB) sendBatchMixedRate(ctx context.Context, d time.Duration) (float64, error) {
	lifecycle := []string{"FileCreated", "FileOverwritten", "FileRenamed", "FileDeleted"}
	types := make([]string, batchSize)
	for i := range types {
		types[i] = lifecycle[i%len(lifecycle)]
	}
	return p.sendBatchRateSQL(ctx, pgqueSendBatchMixedSQL, d, types)
}

// sendBatchRateSQL runs sql with typ (a type, or an array of them), the
// payloads and their keys on one connection.
func (p *pgqueDB) sendBatchRateSQL(ctx context.Context, sql string, d time.Duration, typ any) (float64, error) {
	payloads, keys := batchPayloads(0, batchSize)
	return connLoop(ctx, p.pool, 1, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
		_, err := c.Exec(ctx, sql, typ, payloads, keys)
		return batchSize, err
	})
}

// sendAndTick sends one batch of batchSize events to queue (payload indexes
// from..) and makes a tick right after it, so every batch a consumer reads
// holds exactly those events.
func sendAndTick(ctx context.Context, c *pgx.Conn, queue string, from int) error {
	return sendAndTickN(ctx, c, queue, from, batchSize)
}

// sendAndTickN is sendAndTick for n events.
func sendAndTickN(ctx context.Context, c *pgx.Conn, queue string, from, n int) error {
	payloads, keys := batchPayloads(from, n)
	if _, err := c.Exec(ctx, `select pgque.send_batch($1, $2, $3::jsonb[], $4::text[])`, queue, eventType, payloads, keys); err != nil {
		return fmt.Errorf("send_batch: %w", err)
	}
	return tick(ctx, c, queue)
}

// backlog sends events events to queue in ticked batches of at most
// batchSize.
func backlog(ctx context.Context, c *pgx.Conn, queue string, events int) error {
	for from := 0; from < events; from += batchSize {
		if err := sendAndTickN(ctx, c, queue, from, min(batchSize, events-from)); err != nil {
			return err
		}
	}
	return nil
}

// tick forces a tick of queue (force_next_tick + ticker in one transaction,
// which the contract says always ticks).
func tick(ctx context.Context, c *pgx.Conn, queue string) error {
	return pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", queue); err != nil {
			return fmt.Errorf("force_next_tick: %w", err)
		}
		var id *int64
		if err := tx.QueryRow(ctx, "select pgque.ticker($1)", queue).Scan(&id); err != nil {
			return fmt.Errorf("ticker: %w", err)
		}
		if id == nil {
			return fmt.Errorf("force_next_tick + ticker(%s) made no tick", queue)
		}
		return nil
	})
}

// drainPlain consumes everything available to a plain subscription with
// receive(max batchSize) + ack, each in its own transaction, and returns the
// number of events received.
func drainPlain(ctx context.Context, c *pgx.Conn, queue, consumer string) (int, error) {
	total := 0
	for {
		var batch int64
		n := 0
		rows, err := c.Query(ctx, "select * from pgque.receive($1, $2, $3)", queue, consumer, batchSize)
		if err != nil {
			return total, fmt.Errorf("receive: %w", err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return total, err
			}
			batch = vals[1].(int64)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("receive: %w", err)
		}
		if n == 0 {
			return total, nil
		}
		total += n
		if _, err := c.Exec(ctx, "select pgque.ack($1)", batch); err != nil {
			return total, fmt.Errorf("ack: %w", err)
		}
	}
}

// drainPlainRaw consumes everything available to a plain subscription
// with receive_raw(max batchSize, ack_batch): each call acknowledges the
// previous chunk and returns the next one, payloads as stored, one
// statement per chunk. It returns the number of events received.
func drainPlainRaw(ctx context.Context, c *pgx.Conn, queue, consumer string) (int, error) {
	total := 0
	var ack *int64
	for {
		var batch int64
		n := 0
		rows, err := c.Query(ctx, "select * from pgque.receive_raw($1, $2, $3, $4)", queue, consumer, batchSize, ack)
		if err != nil {
			return total, fmt.Errorf("receive_raw: %w", err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return total, err
			}
			batch = vals[1].(int64)
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("receive_raw: %w", err)
		}
		if n == 0 {
			return total, nil
		}
		total += n
		ack = &batch
	}
}

// drainSlot consumes everything available to slot k of n with
// receive_partitioned + the fenced ack_partitioned as worker, presenting
// token, the slot's lease token, and returns the number of events received.
func drainSlot(ctx context.Context, c *pgx.Conn, queue, consumer string, k, n int, worker, token string) (int, error) {
	return drainSlotChunks(ctx, c, queue, consumer, k, n, worker, token, batchSize)
}

// drainSlotChunks is drainSlot receiving at most chunk events per call.
func drainSlotChunks(ctx context.Context, c *pgx.Conn, queue, consumer string, k, n int, worker, token string, chunk int) (int, error) {
	total := 0
	for {
		got, proof, err := drainSlotRows(c.Query(ctx, "select * from pgque.receive_partitioned($1, $2, $3, $4, $5, $6::uuid, $7)",
			queue, consumer, k, n, worker, token, chunk))
		if err != nil {
			return total, fmt.Errorf("receive_partitioned slot %d/%d: %w", k, n, err)
		}
		if got == 0 {
			return total, nil
		}
		total += got
		if _, err := c.Exec(ctx, "select pgque.ack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, $8, $9)",
			queue, consumer, k, n, worker, token, proof[0], proof[1], proof[2]); err != nil {
			return total, fmt.Errorf("ack_partitioned slot %d/%d: %w", k, n, err)
		}
	}
}

// drainSlotRows is drainRows for a receive_partitioned result; it also
// returns the chunk's proof for the fenced ack: epoch, batch id and the
// first msg_id.
func drainSlotRows(rows pgx.Rows, err error) (int, [3]int64, error) {
	var proof [3]int64
	if err != nil {
		return 0, proof, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		v, err := rows.Values()
		if err != nil {
			return n, proof, err
		}
		if n == 0 {
			proof = [3]int64{v[10].(int64), v[1].(int64), v[0].(int64)}
		}
		n++
	}
	return n, proof, rows.Err()
}

// subscribeSlots subscribes and claims every slot of an N-slot consumer for
// worker and returns the lease token of each slot.
func subscribeSlots(ctx context.Context, c *pgx.Conn, queue, consumer string, n int, worker string) ([]string, error) {
	tokens := make([]string, n)
	for k := range n {
		if _, err := c.Exec(ctx, "select pgque.subscribe_slot($1, $2, $3, $4)", queue, consumer, k, n); err != nil {
			return nil, fmt.Errorf("subscribe_slot %d/%d: %w", k, n, err)
		}
		var token *string
		if err := c.QueryRow(ctx, "select token::text from pgque.claim_slot($1, $2, $3, $4, '10 minutes')", queue, consumer, k, worker).Scan(&token); err != nil {
			return nil, fmt.Errorf("claim_slot %d/%d: %w", k, n, err)
		}
		if token == nil {
			return nil, fmt.Errorf("claim_slot %d/%d: slot held by another worker", k, n)
		}
		tokens[k] = *token
	}
	return tokens, routeIndexes(ctx, c)
}

// routeIndexes builds a new slot group's routing indexes, as the ticker
// does once a subscribe committed (subscribes leave index changes to
// pgque.maint_route_indexes): the suites measure the read and write paths
// a running system has.
func routeIndexes(ctx context.Context, c interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}) error {
	// Upstream PgQue (the wal suite's other side) has none.
	if _, err := c.Exec(ctx, `do $$ begin
		if pg_catalog.to_regprocedure('pgque.maint_route_indexes()') is not null then
			perform pgque.maint_route_indexes();
		end if; end $$`); err != nil {
		return fmt.Errorf("maint_route_indexes: %w", err)
	}
	return nil
}

// checkFloorShape compares the floor table's columns with pgque.event's and
// returns a description of any difference ("" when they match).
func checkFloorShape(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	const q = `select string_agg(column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, ''), ', ' order by ordinal_position)
	  from information_schema.columns where table_schema = $1 and table_name = 'event'`
	var want, have string
	if err := pool.QueryRow(ctx, q, "pgque").Scan(&want); err != nil {
		return "", err
	}
	if err := pool.QueryRow(ctx, q, "bench_floor").Scan(&have); err != nil {
		return "", err
	}
	if want == have {
		return "", nil
	}
	return fmt.Sprintf("floor table differs from pgque.event: pgque.event has (%s), floor has (%s)",
		want, have), nil
}

// plainReadRate builds a backlog of batches ticks of batchSize events in a
// fresh queue with one plain subscription, then times draining it with
// drain (drainPlain: receive(max 1000) + ack; drainPlainRaw: receive_raw
// with the acknowledgement folded in); events per second. It is the pgque
// counterpart of pgqRef.readRate.
func (p *pgqueDB) plainReadRate(ctx context.Context, batches int, drain func(context.Context, *pgx.Conn, string, string) (int, error)) (float64, error) {
	q := p.fresh("read")
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	c := conn.Conn()
	if _, err := c.Exec(ctx, "select pgque.create_queue($1)", q); err != nil {
		return 0, err
	}
	if _, err := c.Exec(ctx, "select pgque.subscribe($1, 'c')", q); err != nil {
		return 0, err
	}
	for i := range batches {
		if err := sendAndTick(ctx, c, q, i*batchSize); err != nil {
			return 0, err
		}
	}
	got := 0
	rate, err := timeIt(ctx, func(ctx context.Context) (int, error) {
		n, err := drain(ctx, c, q, "c")
		got = n
		return n, err
	})
	if err != nil {
		return 0, err
	}
	if got != batches*batchSize {
		return 0, fmt.Errorf("plain consumer received %d events, sent %d", got, batches*batchSize)
	}
	for _, s := range []string{"select pgque.unsubscribe($1, 'c')", "select pgque.drop_queue($1)"} {
		if _, err := c.Exec(ctx, s, q); err != nil {
			return 0, fmt.Errorf("%s: %w", s, err)
		}
	}
	return rate, nil
}
