package partitiontest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// peerRow is one row of announce_worker's result.
type peerRow struct {
	Worker string
	Hungry bool
	Slots  []int32
}

func announce(t *testing.T, conn *pgx.Conn, q, worker string, hungry bool, slots []int32) []peerRow {
	t.Helper()
	rows, err := conn.Query(context.Background(),
		"select worker, hungry, slots from pgque.announce_worker($1, 'c', $2, $3, $4, '1 minute')", q, worker, hungry, slots)
	if err != nil {
		t.Fatal(err)
	}
	peers, err := pgx.CollectRows(rows, pgx.RowToStructByPos[peerRow])
	if err != nil {
		t.Fatal(err)
	}
	return peers
}

// Worker presence is written once per claim pass by every pool, so it must
// not leave dead row versions behind under a held horizon either: with a
// REPEATABLE READ snapshot open, thousands of announcements followed by
// maint() leave no dead tuple in worker_presence and only one record per
// worker, and every announcement still returns each other worker's newest
// state (hunger and slots from its last announcement, itself excluded).
func TestPresenceAppendOnlyUnderHeldHorizon(t *testing.T) {
	t.Parallel()
	const q = "presence"
	d := setup(t)
	ctx := context.Background()
	conn := pgtest.Conn(t, d.dsn)
	one[int32](t, conn, "select pgque.create_queue($1)", q)
	one[int32](t, conn, "select pgque.subscribe_slot($1, 'c', 0, 2)", q)
	one[int32](t, conn, "select pgque.subscribe_slot($1, 'c', 1, 2)", q)

	holder := pgtest.Conn(t, d.dsn)
	htx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer htx.Rollback(ctx)
	if _, err := htx.Exec(ctx, "select pg_catalog.txid_current()"); err != nil {
		t.Fatal(err)
	}

	workers := []string{"w-a", "w-b", "w-c"}
	round := func(r int) {
		for i, w := range workers {
			// Hunger and slots change every round, so a stale record shows.
			hungry := (r+i)%2 == 0
			slots := []int32{int32(r % 2), int32(r)}
			peers := announce(t, conn, q, w, hungry, slots)
			if r == 0 {
				continue // the others have not announced yet
			}
			if len(peers) != len(workers)-1 {
				t.Fatalf("round %d: %s sees %d peers, want %d: %v", r, w, len(peers), len(workers)-1, peers)
			}
			for _, p := range peers {
				if p.Worker == w {
					t.Fatalf("round %d: %s is returned as its own peer", r, w)
				}
				j := map[string]int{"w-a": 0, "w-b": 1, "w-c": 2}[p.Worker]
				// A peer earlier in the round has announced round r, a later one round r-1.
				pr := r
				if j > i {
					pr = r - 1
				}
				if wantH := (pr+j)%2 == 0; p.Hungry != wantH || len(p.Slots) != 2 || p.Slots[1] != int32(pr) {
					t.Fatalf("round %d: %s sees %s as hungry=%v slots=%v, want its round-%d state (hungry=%v, slots [%d %d])",
						r, w, p.Worker, p.Hungry, p.Slots, pr, wantH, pr%2, pr)
				}
			}
		}
	}
	measure := func(from, to int) int64 {
		for r := from; r < to; r++ {
			round(r)
		}
		if _, err := conn.Exec(ctx, "select pgque.maint()"); err != nil {
			t.Fatal(err)
		}
		_, per := deadTuples(t, conn)
		var dead int64
		for rel, n := range per {
			if strings.HasPrefix(rel, "worker_presence") {
				dead += n
			}
		}
		live := one[int64](t, conn, "select count(*) from pgque.worker_presence")
		t.Logf("after %d rounds: %d dead, %d live presence records", to, dead, live)
		if live != int64(len(workers)) {
			t.Errorf("after maint() worker_presence holds %d records for %d workers: the flip did not reclaim them", live, len(workers))
		}
		return dead
	}
	if dead := measure(0, 300); dead != 0 {
		t.Errorf("%d dead presence versions under a held horizon after 900 announcements, want 0", dead)
	}
	if dead := measure(300, 1000); dead != 0 {
		t.Errorf("%d dead presence versions under a held horizon after 3000 announcements, want 0", dead)
	}
	// The state survived the flips: one more round sees every peer's newest.
	round(1000)

	// A worker not heard from within max_age is not returned.
	if _, err := conn.Exec(ctx, `insert into pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_hungry, wp_slots, wp_seen)
		select queue_id, 'c', 'w-old', true, '{}', pg_catalog.clock_timestamp() - interval '2 minutes'
		  from pgque.queue where queue_name = $1`, q); err != nil {
		t.Fatal(err)
	}
	for _, p := range announce(t, conn, q, "w-a", false, []int32{}) {
		if p.Worker == "w-old" {
			t.Errorf("a worker last heard from 2 minutes ago is returned with max_age 1 minute")
		}
	}
}

// TestAnnounceRefusesImpossibleSlots: peers read a worker's announced
// slots back as the slots it works, so a list that no N could hold (a
// negative slot, one past 1023, a NULL, a two-dimensional array) is
// refused with PQ011 and nothing is recorded; so is a max age that could
// hide every live peer.
func TestAnnounceRefusesImpossibleSlots(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.subscribeSlots("q", "c", 4)
	for _, slots := range []string{"{-1}", "{0,1024}", "{0,NULL}", "{{1,2},{3,4}}"} {
		_, err := d.pool.Exec(context.Background(),
			"select * from pgque.announce_worker('q', 'c', 'w', true, $1::int[], '1 minute')", slots)
		wantState(t, err, "PQ011", "announcing slots "+slots)
	}
	// A max age of 0 would say that no peer is alive, whatever the record:
	// refused as any age outside 1 ms to 10 minutes is.
	for _, age := range []string{"0", "-1 second", "10 minutes 1 second"} {
		_, err := d.pool.Exec(context.Background(),
			"select * from pgque.announce_worker('q', 'c', 'w', true, '{0}', $1::interval)", age)
		wantState(t, err, "PQ011", "announcing with max age "+age)
	}
	if n := one[int64](t, d.pool, "select count(*) from pgque.worker_presence"); n != 0 {
		t.Errorf("refused announcements recorded %d presence rows", n)
	}
	conn := pgtest.Conn(t, d.dsn)
	if peers := announce(t, conn, "q", "w", false, []int32{0, 3}); len(peers) != 0 {
		t.Errorf("peers of the only worker: %v", peers)
	}
}
