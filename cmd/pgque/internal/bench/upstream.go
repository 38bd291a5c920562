package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Upstream PgQue beside pgque. With Options.UpstreamSQL the steady, drain
// and wal suites also install upstream PgQue's single-file installer,
// which the user extracted from its repository (the bench ships none of
// it), into a database of its own on the same cluster, and run the same workload
// through upstream's own API: keyed send, receive_partitioned +
// ack_partitioned per slot. Both systems live in a schema named pgque, so
// each needs its own database.
//
// Upstream's default tick schedule is a pg_cron job that calls the
// procedure pgque.ticker_loop() once a second; the procedure calls
// pgque.ticker() every tick_period_ms (100 ms by default) within that
// second, and pgque.ticker() makes a tick when at least ticker_max_count
// (500) events wait or the last tick is ticker_max_lag (3 s) old. Maintenance
// is three more jobs: pgque.maint() and pgque.maint_retry_events() every
// 30 s, pgque.maint_rotate_tables_step2() every 10 s. The bench does not
// need pg_cron: upstreamTicker makes the same calls on the same schedule.

// upstreamFile is the upstream installer the user supplied.
type upstreamFile struct {
	path string
	sql  string
	sum  string // sha256 of the file, hex
}

// readUpstreamFile reads the installer at path.
func readUpstreamFile(path string) (*upstreamFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the upstream PgQue installer: %w", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, fmt.Errorf("reading the upstream PgQue installer: %s is empty", path)
	}
	sum := sha256.Sum256(b)
	return &upstreamFile{path: path, sql: string(b), sum: hex.EncodeToString(sum[:])}, nil
}

// describe names the file and its digest, for the output and the report.
func (u *upstreamFile) describe() string {
	return fmt.Sprintf("%s (sha256 %s)", u.path, u.sum)
}

// upstreamRequired are the functions the bench calls, by signature: a file
// without them is not the release the comparison was written against.
var upstreamRequired = []string{
	"pgque.create_queue(text)",
	"pgque.send(text, text, jsonb, text)",
	"pgque.subscribe_slot(text, text, integer, integer)",
	"pgque.claim_slot(text, text, integer, text, interval)",
	"pgque.receive_partitioned(text, text, integer, integer, text, integer)",
	"pgque.ack_partitioned(text, text, integer, integer, text)",
	"pgque.force_next_tick(text)",
	"pgque.ticker()",
	"pgque.ticker_loop()",
	"pgque.maint()",
	"pgque.maint_retry_events()",
	"pgque.maint_rotate_tables_step2()",
}

// upstreamDB is a fresh database with upstream PgQue installed.
type upstreamDB struct {
	name string
	dsn  string
	pool *pgxpool.Pool
	seq  int
}

// newUpstream creates database name and runs the upstream installer in it
// as one script. A failure names the statement's line in the file and the
// server's error (a missing extension, a newer or older server).
func newUpstream(ctx context.Context, e *env, name string, maxConns int) (*upstreamDB, error) {
	u := e.upstream
	dsn, pool, err := e.freshPool(ctx, name, maxConns)
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	// Without arguments Exec sends the file as one simple query, so its
	// statements run in order in one transaction, as psql -1 would.
	if _, err := conn.Exec(ctx, u.sql); err != nil {
		return nil, fmt.Errorf("installing upstream PgQue from %s into database %s failed%s: %w",
			u.path, name, lineOf(u.sql, err), err)
	}
	var missing []string
	for _, sig := range upstreamRequired {
		var ok bool
		if err := conn.QueryRow(ctx, "select to_regprocedure($1) is not null", sig).Scan(&ok); err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, sig)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("upstream PgQue from %s installed into database %s but lacks %s: the comparison expects v0.3.0-alpha.1's devel/sql/pgque.sql",
			u.path, name, strings.Join(missing, ", "))
	}
	return &upstreamDB{name: name, dsn: dsn, pool: pool}, nil
}

// lineOf returns " at line N" for a server error that carries a position
// in script, "" otherwise.
func lineOf(script string, err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Position <= 0 {
		return ""
	}
	// Position counts characters from 1.
	r := []rune(script)
	pos := min(int(pgErr.Position), len(r))
	return fmt.Sprintf(" at line %d", strings.Count(string(r[:pos]), "\n")+1)
}

// fresh returns a new unique queue name with prefix.
func (u *upstreamDB) fresh(prefix string) string {
	u.seq++
	return fmt.Sprintf("%s%d", prefix, u.seq)
}

// Upstream's API as the bench calls it.
const (
	upstreamSendSQL    = `select pgque.send($1, $2, $3::jsonb, $4)`
	upstreamReceiveSQL = `select payload from pgque.receive_partitioned($1, 'c', $2, $3, $4, $5)`
	upstreamAckSQL     = `select pgque.ack_partitioned($1, 'c', $2, $3, $4)`
	// upstreamBehindSQL says whether a slot has a tick it has not consumed:
	// a receive_partitioned call that finds its slice of a batch empty
	// finishes the batch and returns no rows, exactly as one that finds no
	// batch, so a loop cannot tell from the rows alone whether it caught up.
	upstreamBehindSQL = `select exists (select 1 from pgque.subscription s
	    join pgque.consumer c on c.co_id = s.sub_consumer
	    join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id > s.sub_last_tick
	   where c.co_name = $1)`
	// upstreamMax is the i_max of every receive_partitioned call. The
	// call returns at most i_max rows of the slot's batch and
	// ack_partitioned finishes the whole batch, so i_max must exceed any
	// slice; a call that returns upstreamMax rows is an error.
	upstreamMax    = 10000
	upstreamWorker = "sql-loop"
)

// upstreamLastTick returns the last tick id of queue q (tick ids are per
// queue upstream).
func upstreamLastTick(ctx context.Context, c *pgx.Conn, q string) (int64, error) {
	var n int64
	err := c.QueryRow(ctx, `select coalesce(max(t.tick_id), 0) from pgque.tick t
	  join pgque.queue q on q.queue_id = t.tick_queue where q.queue_name = $1`, q).Scan(&n)
	return n, err
}

// upstreamTicker drives upstream's default schedule from the bench, on
// connections named steadyAppTicker: CALL pgque.ticker_loop() at the start
// of every second (the pg_cron job pgque.start() creates), and the three
// maintenance jobs at their intervals.
type upstreamTicker struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

func startUpstreamTicker(ctx context.Context, dsn string) (*upstreamTicker, error) {
	t := &upstreamTicker{}
	var conns []*pgx.Conn
	for range 2 {
		c, err := pgx.Connect(ctx, withAppName(dsn, steadyAppTicker))
		if err != nil {
			for _, c := range conns {
				c.Close(context.WithoutCancel(ctx))
			}
			return nil, fmt.Errorf("connecting the upstream ticker: %w", err)
		}
		conns = append(conns, c)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t.cancel = cancel
	jobs := [][]upstreamJob{
		{{time.Second, "call pgque.ticker_loop()"}},
		{{10 * time.Second, "select pgque.maint_rotate_tables_step2()"},
			{30 * time.Second, "select pgque.maint_retry_events()"},
			{30 * time.Second, "select pgque.maint()"}},
	}
	for i, c := range conns {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer c.Close(context.WithoutCancel(ctx))
			if err := runUpstreamJobs(lctx, c, jobs[i]); err != nil && lctx.Err() == nil {
				t.mu.Lock()
				t.err = errors.Join(t.err, err)
				t.mu.Unlock()
			}
		}()
	}
	return t, nil
}

// upstreamJob is one scheduled statement.
type upstreamJob struct {
	every time.Duration
	sql   string
}

// runUpstreamJobs runs each job at every multiple of its interval from the
// start, in turn on one connection (a job that overruns delays the next,
// as a busy pg_cron worker would).
func runUpstreamJobs(ctx context.Context, c *pgx.Conn, jobs []upstreamJob) error {
	start := time.Now()
	next := make([]time.Time, len(jobs))
	for i, j := range jobs {
		next[i] = start.Add(j.every)
		if j.every == time.Second {
			next[i] = start
		}
	}
	for {
		due := next[0]
		for _, n := range next[1:] {
			if n.Before(due) {
				due = n
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Until(due)):
		}
		for i, j := range jobs {
			if time.Now().Before(next[i]) {
				continue
			}
			if _, err := c.Exec(ctx, j.sql); err != nil {
				return fmt.Errorf("upstream ticker: %s: %w", j.sql, err)
			}
			for !next[i].After(time.Now()) {
				next[i] = next[i].Add(j.every)
			}
		}
	}
}

// stop ends the schedule and returns the first error a job met.
func (t *upstreamTicker) stop() error {
	if t.cancel != nil {
		t.cancel()
		t.wg.Wait()
		t.cancel = nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// subscribeUpstreamSlots subscribes and claims every slot of an N-slot
// consumer "c" of queue q for upstreamWorker.
func subscribeUpstreamSlots(ctx context.Context, c *pgx.Conn, q string, n int) error {
	for k := range n {
		if _, err := c.Exec(ctx, "select pgque.subscribe_slot($1, 'c', $2, $3)", q, k, n); err != nil {
			return fmt.Errorf("upstream subscribe_slot %d/%d: %w", k, n, err)
		}
		var epoch *int64
		if err := c.QueryRow(ctx, "select pgque.claim_slot($1, 'c', $2, $3, '10 minutes')", q, k, upstreamWorker).Scan(&epoch); err != nil {
			return fmt.Errorf("upstream claim_slot %d/%d: %w", k, n, err)
		}
		if epoch == nil {
			return fmt.Errorf("upstream claim_slot %d/%d: slot held by another worker", k, n)
		}
	}
	return nil
}

// upstreamSlotLoop is one slot's consumer: LISTEN on the queue's channel
// (pgque_<queue>, one notification per tick), and on each notification
// receive_partitioned, ack_partitioned when it returned rows, and again
// until the slot has no unconsumed tick.
func upstreamSlotLoop(ctx context.Context, c *pgx.Conn, q string, k, n int, lat *latencyLog, gate *loopGate) error {
	name := fmt.Sprintf("c#%d/%d", k, n)
	for {
		for {
			if err := gate.wait(ctx); err != nil {
				return err
			}
			got, err := upstreamReceive(ctx, c, q, k, n, lat)
			if err != nil {
				return err
			}
			if got > 0 {
				if _, err := c.Exec(ctx, upstreamAckSQL, q, k, n, upstreamWorker); err != nil {
					return fmt.Errorf("upstream ack_partitioned slot %d/%d: %w", k, n, err)
				}
				continue
			}
			var behind bool
			if err := c.QueryRow(ctx, upstreamBehindSQL, name).Scan(&behind); err != nil {
				return fmt.Errorf("upstream slot %d/%d position: %w", k, n, err)
			}
			if !behind {
				break
			}
		}
		if _, err := c.WaitForNotification(ctx); err != nil {
			return err
		}
	}
}

// upstreamReceive makes one receive_partitioned call for slot k and
// records the payloads; it returns the rows received.
func upstreamReceive(ctx context.Context, c *pgx.Conn, q string, k, n int, lat *latencyLog) (int, error) {
	rows, err := c.Query(ctx, upstreamReceiveSQL, q, k, n, upstreamWorker, upstreamMax)
	if err != nil {
		return 0, fmt.Errorf("upstream receive_partitioned slot %d/%d: %w", k, n, err)
	}
	defer rows.Close()
	got := 0
	now := time.Now()
	for rows.Next() {
		var payload []byte
		if err := rows.Scan(&payload); err != nil {
			return got, err
		}
		if err := lat.record(payload, now); err != nil {
			return got, err
		}
		got++
	}
	if err := rows.Err(); err != nil {
		return got, fmt.Errorf("upstream receive_partitioned slot %d/%d: %w", k, n, err)
	}
	if got >= upstreamMax {
		return got, fmt.Errorf("upstream receive_partitioned slot %d/%d returned %d rows, its i_max: the batch may hold more, which ack_partitioned would finish unread", k, n, got)
	}
	return got, nil
}
