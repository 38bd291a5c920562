package pgtest

import (
	"context"
	"testing"

	"github.com/pgque/pgque/internal/pgcluster"
)

// NewCluster starts a private cluster for one test, stopped and removed when
// the test ends. Use it for tests that restart, crash or reconfigure the
// server; it needs local server binaries even when PGQUE_TEST_DSN is set, and
// fails the test with installation instructions when there are none.
func NewCluster(t testing.TB, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal("pgtest:", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Error("pgtest:", err)
		}
	})
	return c
}
