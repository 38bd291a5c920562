package enginetest

import (
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// The ticker lease renews without updating its row (renewals move
// ticker_beat_seq), and the renewal still counts: a second ticker is
// refused while the renewed lease lives, takes over with a new epoch once
// it ran out, and the first one is then refused too.
func TestTickerLeaseRenewalWithoutRowVersions(t *testing.T) {
	t.Parallel()
	_, pool := setupDB(t)
	lead := func(worker, ttl string) bool {
		t.Helper()
		return scalar[bool](t, pool, "select pgque.ticker_lead($1, $2::interval)", worker, ttl)
	}
	rowVersion := func() string {
		t.Helper()
		return scalar[string](t, pool, "select xmin::text || '/' || ctid::text from pgque.ticker_lease")
	}
	epoch := func() int64 {
		t.Helper()
		return scalar[int64](t, pool, "select epoch from pgque.ticker_lease")
	}
	if !lead("a", "400 milliseconds") {
		t.Fatal("a did not get the free ticker lease")
	}
	claimed, e1 := rowVersion(), epoch()
	// Renew for longer than the claim's TTL: b stays refused all along,
	// so the renewals are what keeps a's lease alive.
	// The 1.2 s window, three TTLs, is the subject, not a wait.
	from := time.Now()
	pgtest.WaitFor(t, 30*time.Second, "1.2 s of renewals", func() bool {
		if !lead("a", "400 milliseconds") {
			t.Fatal("a lost the lease it renews")
		}
		if lead("b", "400 milliseconds") {
			t.Fatal("b took the lease while a renews it")
		}
		return time.Since(from) >= 1200*time.Millisecond
	})
	if v := rowVersion(); v != claimed {
		t.Errorf("renewals rewrote the lease row: version %s, claimed as %s", v, claimed)
	}
	// a stops renewing: b takes over once the renewed expiry passed.
	pgtest.WaitFor(t, 10*time.Second, "b to take over the lease a stopped renewing", func() bool {
		return lead("b", "400 milliseconds")
	})
	if e2 := epoch(); e2 != e1+1 {
		t.Errorf("epoch after the takeover = %d, want %d", e2, e1+1)
	}
	if lead("a", "400 milliseconds") {
		t.Error("a still leads after b took over")
	}
}
