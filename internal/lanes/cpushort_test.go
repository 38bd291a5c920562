package lanes

import (
	"math"
	"testing"
	"time"
)

// TestSchedShort: the process is short of CPU when at least one in ten of
// the goroutine waits counted since the last read lasted a millisecond or
// more; waits counted before the last read do not count again.
func TestSchedShort(t *testing.T) {
	t.Parallel()
	// Buckets: [-inf, 0.0001), [0.0001, 0.001), [0.001, 0.01), [0.01, +inf).
	buckets := []float64{math.Inf(-1), 0.0001, 0.001, 0.01, math.Inf(1)}
	for _, tc := range []struct {
		name      string
		prev, cur []uint64
		want      bool
	}{
		{"no wait at all", nil, []uint64{0, 0, 0, 0}, false},
		{"short waits only", nil, []uint64{500, 400, 0, 0}, false},
		{"one long wait in ten", nil, []uint64{50, 40, 8, 2}, true},
		{"one in twenty", nil, []uint64{100, 90, 10, 0}, false},
		{"long waits before the last read only", []uint64{10, 10, 90, 10}, []uint64{510, 410, 90, 10}, false},
		{"long waits since the last read", []uint64{500, 400, 0, 0}, []uint64{510, 410, 20, 0}, true},
	} {
		if got := schedShort(tc.prev, tc.cur, buckets); got != tc.want {
			t.Errorf("%s: schedShort = %v, want %v", tc.name, got, tc.want)
		}
	}
	// The runtime's own histogram reads without error, twice within the
	// sampling interval with the same answer.
	p := newSchedProbe()
	now := time.Now()
	if a, b := p.cpuShort(now), p.cpuShort(now.Add(schedSampleEvery/2)); a != b {
		t.Errorf("two reads within %v disagree: %v, %v", schedSampleEvery, a, b)
	}
}

// TestSlowGrowsOnlyWhenCPUsAreShort: with eight chunks running inline per
// CPU, a handler that has run for 3 ms makes its run suspect (a look again
// one FanOutAfter later) only while the process is not short of CPU; while
// it is, the thresholds are eight times FanOutAfter and the run is not
// suspect yet.
func TestSlowGrowsOnlyWhenCPUsAreShort(t *testing.T) {
	t.Parallel()
	for _, short := range []bool{false, true} {
		pool := NewPool(16, 1, 0, nil)
		pool.cpuShort = func(time.Time) bool { return short }
		pool.inline.Store(8)
		s := NewSlot(pool, Host[*event, string](newHost()), 16, nil, nil)
		in := s.newInline(chunkOf(0, "a", "b"), false)
		now := time.Now()
		in.cur, in.next, in.running, in.started, in.begin = 0, 0, true, now.Add(-3*time.Millisecond), now.Add(-3*time.Millisecond)
		wait, slow := s.slow(in, now, FanOutAfter)
		if slow {
			t.Fatalf("short %v: slow at the first look; want a second look first", short)
		}
		if suspect := !in.suspect.IsZero(); suspect == short {
			t.Errorf("short %v: run suspect = %v after a 3 ms handler (wait %v)", short, suspect, wait)
		}
		if !short && wait != FanOutAfter {
			t.Errorf("not short: look again in %v, want %v", wait, FanOutAfter)
		}
	}
}
