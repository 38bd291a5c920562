package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

// TestStatusWarnings pins the status checks on synthetic rows: an unpolled
// slot (lag, no live owner), a stuck slot and consumer (lag, old last
// batch), an overdue rotation blamed on the subscription with the oldest
// cursor, a ticker that does not run, and dead letters.
func TestStatusWarnings(t *testing.T) {
	t.Parallel()
	th := thresholds{stuckAfter: 30 * time.Second}
	owner := "w1"
	slotCases := []struct {
		row  slotRow
		want string
	}{
		{slotRow{Lag: 0, LastActiveSeconds: 999}, ""},
		{slotRow{Lag: 5, LastActiveSeconds: 1}, "unpolled: 5 pending, no live owner"},
		{slotRow{Lag: 5, Owner: &owner, LastActiveSeconds: 1}, ""},
		{slotRow{Lag: 5, Owner: &owner, LastActiveSeconds: 90}, "stuck: 5 pending, last batch 1m30s ago"},
	}
	for _, tc := range slotCases {
		if got := joinWarnings(th.slotWarnings(&tc.row)); got != tc.want {
			t.Errorf("slotWarnings(%+v) = %q, want %q", tc.row, got, tc.want)
		}
	}
	if got := joinWarnings(th.consumerWarnings(&consumerInfo{Pending: 3, LastSeenSeconds: 45})); got != "stuck: 3 pending, last batch 45s ago" {
		t.Errorf("consumerWarnings = %q", got)
	}
	if got := th.consumerWarnings(&consumerInfo{Pending: 0, LastSeenSeconds: 4500}); got != nil {
		t.Errorf("an idle consumer with nothing pending got warnings %q", got)
	}

	q := queueStatus{queueInfo: queueInfo{Name: "q", SinceRotation: 7200 + 600, TickerLagSeconds: 200, DeadLetters: 2,
		Config: view.QueueConfig{RotationSeconds: 7200, IdleSeconds: 60}}}
	subs := []consumerInfo{
		{Queue: "q", Consumer: "fast", LagSeconds: 1},
		{Queue: "q", Consumer: "slow#3/8", LagSeconds: 7000},
		{Queue: "other", Consumer: "older", LagSeconds: 9000},
	}
	got := strings.Join(queueWarnings(&q, subs, nil), "\n")
	for _, want := range []string{
		"table rotation overdue by 10m0s, pinned by subscription slow#3/8 (cursor 1h57m old)",
		"no tick for 3m20s: is a ticker running?",
		"2 dead letters (pgque dlq list q)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("queueWarnings:\n%s\nwant a line with %q", got, want)
		}
	}
	if !q.RotationOverdue || q.PinnedBy != "slow#3/8" {
		t.Errorf("queue status = %+v, want rotation overdue, pinned by slow#3/8", q)
	}
	healthy := queueStatus{queueInfo: queueInfo{Name: "q", SinceRotation: 10, TickerLagSeconds: 0.01,
		Config: view.QueueConfig{RotationSeconds: 7200, IdleSeconds: 60}}}
	if w := queueWarnings(&healthy, subs, nil); len(w) != 0 {
		t.Errorf("a healthy queue got warnings %q", w)
	}
}

func TestFmtSeconds(t *testing.T) {
	t.Parallel()
	for sec, want := range map[float64]string{0.0123: "12ms", 3.44: "3.4s", 310: "5m10s", 7380: "2h3m", 0: "0s"} {
		if got := fmtSeconds(sec); got != want {
			t.Errorf("fmtSeconds(%v) = %q, want %q", sec, got, want)
		}
	}
}
