package chaos

import (
	"bytes"
	"context"
	"github.com/pgque/pgque/internal/pgbouncer"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// buildProc builds the chaos process binary (without -race: the processes
// are the system under test, the race detector would only slow them down;
// the runner and checker in this test binary keep whatever flags the test
// was built with).
func buildProc(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(t.TempDir(), "chaosproc")
	cmd := exec.Command(goBin, "build", "-o", out, "./cmd/chaosproc")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building chaosproc: %v\n%s", err, b)
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for the runner's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestChaosShortRun runs a short chaos test with every fault kind under
// the pause policy, then a shorter one under skip, and requires a clean
// history from both.
func TestChaosShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos run skipped in -short mode")
	}
	bin := buildProc(t)
	runs := []struct {
		name     string
		opts     Options
		allKinds bool
	}{
		{"pause", Options{Policy: "pause", Duration: 55 * time.Second, FaultInterval: 4 * time.Second}, true},
		{"skip", Options{Policy: "skip", Duration: 20 * time.Second, FaultInterval: 3 * time.Second,
			Faults: []string{FaultWorkerKill, FaultWorkerStop, FaultPGRestart}}, false},
	}
	for _, tc := range runs {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Policy, o.Duration, o.FaultInterval, o.Faults = tc.opts.Policy, tc.opts.Duration, tc.opts.FaultInterval, tc.opts.Faults
			o.ProcCommand = []string{bin}
			o.RunDir = filepath.Join(t.TempDir(), "run")
			o.DrainTimeout = 60 * time.Second
			o.Rate = 100
			o.Keys = 32
			var out syncBuffer
			o.Out = &out
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			sum, err := Run(ctx, o)
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if !sum.OK() {
				keepRunDir(t, o.RunDir)
				t.Fatalf("%d violations", sum.Report.ViolationCount())
			}
			if !sum.Drained {
				keepRunDir(t, o.RunDir)
				t.Fatal("the workers did not drain the queue")
			}
			if sum.Workers > 0 && sum.Claims < sum.Workers {
				t.Errorf("%d lease claims read from the logs of %d workers", sum.Claims, sum.Workers)
			}
			if sum.Report.Committed < 500 {
				t.Errorf("only %d events committed", sum.Report.Committed)
			}
			kinds := o.Faults
			if tc.allKinds || kinds == nil {
				kinds = append(AllFaults, FaultHandlerError, FaultHandlerPanic)
				if _, err := os.Stat(pgbouncer.Path); err != nil {
					t.Logf("no %s: PgBouncer faults not injected", pgbouncer.Path)
				}
			}
			for _, k := range kinds {
				if k == FaultPgBouncerKill {
					if _, err := os.Stat(pgbouncer.Path); err != nil {
						continue
					}
				}
				if sum.Faults[k] == 0 {
					t.Errorf("no %s fault was injected", k)
				}
			}
		})
	}
}

// keepRunDir copies a failed run's directory (records, faults, logs) out
// of the test's temporary directory, which is removed when the test ends:
// to $PGQUE_CHAOS_KEEP, else to a new directory under the system's.
func keepRunDir(t *testing.T, dir string) {
	t.Helper()
	base := os.Getenv("PGQUE_CHAOS_KEEP")
	if base == "" {
		base = os.TempDir()
	}
	dst, err := os.MkdirTemp(base, "pgque-chaos-failed-")
	if err != nil {
		t.Logf("keeping the run directory: %v", err)
		return
	}
	if out, err := exec.Command("cp", "-r", dir, dst).CombinedOutput(); err != nil {
		t.Logf("keeping the run directory: %v: %s", err, out)
		return
	}
	t.Logf("run directory kept in %s", dst)
}
