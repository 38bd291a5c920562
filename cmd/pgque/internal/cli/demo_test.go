package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/cmd/pgque/internal/demo"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// TestDemoCommand: pgque demo passes its own verification (in a given
// database, and in a throwaway cluster of its own), prints its summary or
// JSON, and exits 1 with one line on stderr when verification fails.
func TestDemoCommand(t *testing.T) {
	t.Parallel()
	small := []string{"demo", "--tenants", "10", "--events", "500"}

	t.Run("passes", func(t *testing.T) {
		t.Parallel()
		r := execIn(deadline(t), nil, "", append(small, "--dsn", pgtest.NewDB(t))...)
		if r.code != 0 || !strings.Contains(r.stdout, "PASSED") || !strings.Contains(r.stdout, "latency") {
			t.Errorf("demo: %v", r)
		}
	})
	t.Run("json with failures", func(t *testing.T) {
		t.Parallel()
		r := execIn(deadline(t), nil, "", append(small, "--failure-rate", "0.05", "--json", "--dsn", pgtest.NewDB(t))...)
		var res demo.Result
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 || !res.Passed || res.Applied != 500 || res.InjectedFailures == 0 {
			t.Errorf("demo --json (%v): %+v\n%v", err, res, r)
		}
	})
	t.Run("fails verification", func(t *testing.T) {
		t.Parallel()
		hook := func(a *app) {
			a.demoHook = func(o *demo.Options) { demo.SkipEventForTest(o, "t0002", 2) }
		}
		r := execIn(deadline(t), hook, "", append(small, "--dsn", pgtest.NewDB(t))...)
		if r.code != ExitFailure || !strings.Contains(r.stdout, "FAILED") {
			t.Errorf("demo with a skipped event: %v", r)
		}
		last := r.stderr[strings.LastIndex(strings.TrimSuffix(r.stderr, "\n"), "\n")+1:]
		if last != "pgque: demo: verification failed (see the checks above)\n" {
			t.Errorf("demo with a skipped event ended stderr with %q", last)
		}
	})
	t.Run("throwaway cluster", func(t *testing.T) {
		t.Parallel()
		r := execIn(deadline(t), nil, "", "demo", "--tenants", "5", "--events", "200")
		if r.code != 0 || !strings.Contains(r.stdout, "throwaway cluster") || !strings.Contains(r.stderr, "removing the throwaway cluster") {
			t.Errorf("demo without --dsn: %v", r)
		}
	})
}

// deadline returns a context that ends after two minutes or with the test.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
