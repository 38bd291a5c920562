package securitytest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestHostileNeighbours runs an application's partitioned pool and
// producer for a few seconds (as its own login roles, with public first on
// their search_path) while, at the same time:
//
//   - a role with no pgque grant LISTENs on every pgque channel, NOTIFYs
//     forged announcements and hints, holds every advisory lock key pgque
//     ever used, and idles in a transaction holding a LISTEN;
//   - a reader of another application tries every consume entry point on
//     the first application's confined queue and consumer, burns
//     subscription ids in rolled-back transactions, and subscribes many N
//     on its own queue;
//   - a second session of the application's own reader login, which knows
//     the pool's worker id, tries to receive, ack and release as it and to
//     claim its slots, with guessed lease tokens;
//   - a role with CREATE on the database has planted functions, operators
//     and domains in public;
//   - a superuser re-installs pgque, as its owner.
//
// Then it checks that every event was handled, in order per key, the
// producer was never held up past a bound, the pool kept its slots, no
// planted object ran, and the notifications carried no worker id.
func TestHostileNeighbours(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	c, super, newDB := installerCluster(t)
	ctx := context.Background()
	dsn := newDB("neighbours")
	owner := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "pgque_owner"))
	if _, err := install.Install(ctx, owner); err != nil {
		t.Fatal(err)
	}
	mustExec(t, super,
		`create role app_r login`, `create role app_w login`, `create role app_admin login`, `create role other_r login`)
	mustExec(t, owner,
		`grant pgque_reader to app_r, other_r`, `grant pgque_writer to app_w`, `grant pgque_admin to app_admin`)
	for _, r := range []string{"app_r", "app_w", "app_admin"} {
		mustExec(t, super, `alter role `+r+` set search_path = public, pg_catalog, pgque`)
	}
	admin := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "app_admin"))
	mustExec(t, admin,
		`select pgque.create_queue('files')`, `select pgque.create_queue('other')`,
		`select pgque.subscribe_slot('files', 'thumbs', s, 4) from generate_series(0, 3) s`,
		`select pgque.grant_queue('files', 'app_r', 'consume')`, `select pgque.grant_queue('files', 'app_w', 'produce')`,
	)

	// The role with CREATE on the database plants its shadows before the
	// application connects, so that every statement the application's
	// sessions prepare is resolved with them in place.
	attacker := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "attacker"))
	for _, s := range shadows {
		if _, err := attacker.Exec(ctx, s); err != nil {
			t.Fatalf("attacker: %s: %v", s, err)
		}
	}
	client := func(role string) *pgque.Client {
		cl, err := pgque.Connect(ctx, pgtest.DSNWith(dsn, "user", role), &pgque.Config{Logger: nil})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	adminClient, reader, writer := client("app_admin"), client("app_r"), client("app_w")
	tk, err := adminClient.NewTicker(&pgque.TickerConfig{LeaseTTL: 2 * time.Second, MaintInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer tk.Stop(ctx)

	const workerID = "app-worker-7f3a"
	var mu sync.Mutex
	seen := map[string][]int{} // key -> payload sequence numbers in delivery order
	handled := map[string]bool{}
	pool, err := reader.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: "files", Consumer: "thumbs", Slots: 4, WorkerID: workerID,
		LeaseTTL: 3 * time.Second, ClaimInterval: 200 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		Handler: func(_ context.Context, m *pgque.Message) error {
			var n int
			if err := m.Decode(&n); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			seen[m.PartitionKey] = append(seen[m.PartitionKey], n)
			handled[fmt.Sprintf("%s/%d", m.PartitionKey, n)] = true
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pool.Stop(ctx)
	pgtest.WaitFor(t, 20*time.Second, "the pool to hold its 4 slots", func() bool { return len(pool.OwnedSlots()) == 4 })

	runCtx, stopRun := context.WithTimeout(ctx, 4*time.Second)
	defer stopRun()
	var wg sync.WaitGroup
	var sent atomic.Int64
	var worstSend atomic.Int64
	sendErrs := make(chan error, 1)
	wg.Add(1)
	go func() { // the producer
		defer wg.Done()
		for i := 0; runCtx.Err() == nil; i++ {
			key := fmt.Sprintf("tenant-%d", i%16)
			start := time.Now()
			_, err := writer.Send(ctx, "files", pgque.Event{Type: "FileCreated", Payload: i / 16, PartitionKey: key})
			if err != nil {
				select {
				case sendErrs <- err:
				default:
				}
				return
			}
			if d := int64(time.Since(start)); d > worstSend.Load() {
				worstSend.Store(d)
			}
			sent.Add(1)
			_ = pgtest.Work(runCtx, 2*time.Millisecond) // the producer's pace is the workload
		}
	}()
	var minOwned atomic.Int64
	minOwned.Store(4)
	wg.Add(1)
	go func() { // watches the pool's slots
		defer wg.Done()
		// Sampled every 20 ms for the whole run: the samples are the
		// observation, not a wait.
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if n := int64(len(pool.OwnedSlots())); n < minOwned.Load() {
				minOwned.Store(n)
			}
			select {
			case <-runCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	// The stranger.
	stranger := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "stranger"))
	mustExec(t, stranger, `listen pgque`, `listen pgque_workers`,
		`select pg_advisory_lock(hashtext('pgque.create_queue'))`, `select pg_advisory_lock(`+itoa64(install.LockKey)+`)`)
	idler := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "stranger"))
	itx, err := idler.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer itx.Rollback(ctx)
	if _, err := itx.Exec(ctx, `listen pgque`); err != nil {
		t.Fatal(err)
	}
	var payloads []string
	var payMu sync.Mutex
	forger := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "stranger"))
	forgerPID := forger.PgConn().PID()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; runCtx.Err() == nil; i++ {
			for _, p := range []string{
				`{"q":"files","c":"thumbs","w":"fake-` + itoa(i%5) + `","h":true,"s":[]}`,
				"files", "", strings.Repeat("x", 7999),
			} {
				if _, err := forger.Exec(ctx, `select pg_notify('pgque_workers', $1), pg_notify('pgque', $1)`, p); err != nil {
					t.Error("stranger notify:", err)
					return
				}
			}
			_ = pgtest.Work(runCtx, 5*time.Millisecond) // the stranger's pace is the workload
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for runCtx.Err() == nil {
			lctx, cancel := context.WithTimeout(runCtx, 200*time.Millisecond)
			n, err := stranger.WaitForNotification(lctx)
			cancel()
			if err == nil && n.PID != forgerPID {
				payMu.Lock()
				payloads = append(payloads, n.Channel+":"+n.Payload)
				payMu.Unlock()
			}
		}
	}()

	// The other application's reader.
	other := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "other_r"))
	var otherDenied, otherAllowed atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		attacks := []string{
			`select pgque.claim_slot('files', 'thumbs', 0, '` + workerID + `', '1 day')`,
			`select pgque.release_slot('files', 'thumbs', 1, '` + workerID + `', ` + tok + `)`,
			`select * from pgque.receive_partitioned('files', 'thumbs', 2, 4, '` + workerID + `', ` + tok + `, 100)`,
			`select pgque.ack_partitioned('files', 'thumbs', 3, 4, '` + workerID + `', ` + tok + `, 1, 1, 1)`,
			`select * from pgque.announce_worker('files', 'thumbs', 'fake', true, '{}', '1 s')`,
			`select pgque.unsubscribe_slot('files', 'thumbs', 0, 4)`,
			`select pgque.subscribe('files', 'spy')`,
			`select * from pgque.receive('files', 'spy', 100)`,
			`select pgque.send('files', '{}'::jsonb)`,
		}
		for i := 0; runCtx.Err() == nil; i++ {
			for _, a := range attacks {
				_, err := other.Exec(ctx, a)
				if codeOf(err) == "42501" {
					otherDenied.Add(1)
				} else {
					otherAllowed.Add(1)
					t.Errorf("other app: %s: %v", a, err)
				}
			}
			tx, err := other.Begin(ctx)
			if err == nil {
				_, _ = tx.Exec(ctx, `select pgque.subscribe('other', 'burn' || $1::int)`, i)
				_ = tx.Rollback(ctx)
			}
			_, _ = other.Exec(ctx, `select pgque.subscribe_slot('other', 'n' || $1::int, 0, $1::int)`, 2+i%50)
		}
	}()

	// A second session of the application's own reader login knows the
	// pool's worker id (from the lease view) and each slot's epoch and open
	// batch, and tries to act as the pool's lease holder with tokens it
	// guesses: every call must be refused (PQ085, or NULL for a claim).
	thief := pgtest.Conn(t, pgtest.DSNWith(dsn, "user", "app_r"))
	var thiefRefused, thiefAllowed atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; runCtx.Err() == nil; i++ {
			slot := i % 4
			var owner *string
			var epoch, batch int64
			// Its own statement qualifies operators too: public's are the attacker's.
			if err := thief.QueryRow(ctx, `select owner, epoch, coalesce(open_batch, 0) from pgque.partition_slot_status
				where queue operator(pg_catalog.=) 'files' and consumer operator(pg_catalog.=) 'thumbs'
				  and slot operator(pg_catalog.=) $1`, slot).Scan(&owner, &epoch, &batch); err != nil {
				var pe *pgconn.PgError
				if errors.As(err, &pe) {
					t.Logf("error detail: %s; context: %s", pe.Detail, pe.Where)
				}
				t.Error("thief reading the lease view:", err)
				return
			}
			if owner == nil || *owner != workerID {
				continue // between leases: nothing to steal
			}
			guess := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, epoch)
			h := fmt.Sprintf("'files', 'thumbs', %d, 4, '%s', '%s'", slot, workerID, guess)
			for _, a := range []string{
				fmt.Sprintf("select * from pgque.receive_partitioned(%s, 100)", h),
				fmt.Sprintf("select pgque.ack_partitioned(%s, %d, %d, 1)", h, epoch, batch),
				fmt.Sprintf("select pgque.release_slot('files', 'thumbs', %d, '%s', '%s')", slot, workerID, guess),
				fmt.Sprintf("select pgque.release_stale_holds_partitioned(%s)", h),
			} {
				_, err := thief.Exec(ctx, a)
				if c := codeOf(err); c == "PQ085" || c == "55P03" {
					thiefRefused.Add(1)
				} else {
					thiefAllowed.Add(1)
					t.Errorf("thief: %s: %v", a, err)
				}
			}
			var e *int64
			if err := thief.QueryRow(ctx, `select epoch from pgque.claim_slot('files', 'thumbs', $1, $2, '1 day')`, slot, workerID).Scan(&e); err != nil || e != nil {
				t.Errorf("thief's claim of slot %d as %s = %v, %v; want NULL", slot, workerID, e, err)
			}
		}
	}()

	// The superuser re-installs while everything runs, as the schema's
	// owner (it refuses a schema another role owns otherwise).
	pgtest.WaitFor(t, 30*time.Second, "the producer to be sending", func() bool { return sent.Load() >= 100 })
	superApp := pgtest.Conn(t, pgtest.DSNWith(c.DSN("neighbours"), "options", "-c role=pgque_owner"))
	if _, err := install.Install(ctx, superApp); err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			t.Logf("error detail: %s; context: %s", pe.Detail, pe.Where)
		}
		t.Errorf("superuser re-install during the run: %v", err)
	}

	wg.Wait()
	select {
	case err := <-sendErrs:
		t.Fatalf("the producer failed: %v", err)
	default:
	}
	total := sent.Load()
	pgtest.WaitFor(t, 30*time.Second, "every event to be handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int64(len(handled)) >= total
	})
	mu.Lock()
	for key, ns := range seen {
		last := -1
		for _, n := range ns {
			if n < last {
				t.Errorf("key %s delivered out of order: %v", key, ns)
				break
			}
			last = n
		}
	}
	mu.Unlock()
	if w := time.Duration(worstSend.Load()); w > 2*time.Second {
		t.Errorf("a send took %v while the neighbours were at work", w)
	}
	if m := minOwned.Load(); m < 4 {
		t.Errorf("the pool dropped to %d slots: forged announcements or the other app moved its slots", m)
	}
	if thiefRefused.Load() == 0 || thiefAllowed.Load() != 0 {
		t.Errorf("thief with the worker id: %d calls refused, %d allowed", thiefRefused.Load(), thiefAllowed.Load())
	}
	if otherDenied.Load() == 0 || otherAllowed.Load() != 0 {
		t.Errorf("other app: %d calls denied, %d allowed", otherDenied.Load(), otherAllowed.Load())
	}
	payMu.Lock()
	for _, p := range payloads {
		if strings.Contains(p, workerID) || strings.Contains(p, "thumbs") || p == "pgque:files" {
			t.Errorf("a stranger heard %q", p)
			break
		}
	}
	heard := len(payloads)
	payMu.Unlock()
	assertNoShadowCalls(t, super2(t, c.DSN("neighbours")), "the run")
	t.Logf("%d events sent and handled; worst send %v; stranger heard %d notifications; other app denied %d times",
		total, time.Duration(worstSend.Load()), heard, otherDenied.Load())
}

func super2(t *testing.T, dsn string) *pgx.Conn { return pgtest.Conn(t, dsn) }

var _ = pgconn.PgError{}
