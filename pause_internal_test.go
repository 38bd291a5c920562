package pgque

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
)

func strp(s string) *string { return &s }

// TestHandleChunkHoldsFailedKeys: under pause, once the handler failed on
// an event of a key, the chunk's later events of that key are not handled;
// the NULL key and the empty key are different keys; other keys go on.
// Without holding (skip), every event is handled.
func TestHandleChunkHoldsFailedKeys(t *testing.T) {
	t.Parallel()
	// id: key (nil = NULL)
	rows := []dbq.Row{
		{MsgID: 1, PartitionKey: nil}, {MsgID: 2, PartitionKey: strp("")}, {MsgID: 3, PartitionKey: strp("a")},
		{MsgID: 4, PartitionKey: nil}, {MsgID: 5, PartitionKey: strp("")}, {MsgID: 6, PartitionKey: strp("a")},
		{MsgID: 7, PartitionKey: nil}, {MsgID: 8, PartitionKey: strp("")}, {MsgID: 9, PartitionKey: strp("a")},
	}
	fail := map[int64]bool{1: true, 6: true} // the NULL key fails first, "a" later
	for _, tc := range []struct {
		hold     bool
		handled  []int64
		failures []int64
		held     int
	}{
		{hold: true, handled: []int64{1, 2, 3, 5, 6, 8}, failures: []int64{1, 6}, held: 3},
		{hold: false, handled: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9}, failures: []int64{1, 6}, held: 0},
	} {
		var handled []int64
		iv := invoker{
			queue: "q", consumer: "c", logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: metrics.New(nil),
			handler: func(_ context.Context, m *Message) error {
				handled = append(handled, m.ID)
				if fail[m.ID] {
					if m.ID == 6 {
						panic("boom")
					}
					return errors.New("fail")
				}
				return nil
			},
		}
		run := iv.handleChunk(context.Background(), toMessages(rows, "q", "c", 0), tc.hold, nil)
		failures, held, aborted := run.failures, run.held, run.aborted
		var failed []int64
		for _, f := range failures {
			failed = append(failed, f.msg.ID)
		}
		if aborted || held != tc.held || !slices.Equal(handled, tc.handled) || !slices.Equal(failed, tc.failures) {
			t.Errorf("hold %v: handled %v, failures %v, held %d, aborted %v; want %v, %v, %d",
				tc.hold, handled, failed, held, aborted, tc.handled, tc.failures, tc.held)
		}
		if !errors.Is(failures[1].err, ErrHandlerPanic) {
			t.Errorf("the panic became %v", failures[1].err)
		}
	}
}

// TestHandleChunkGivenUp: once the slot is given up, no other event
// starts; the rest comes back in chunk order, but for the events of a key
// that failed under pause (the nack defers those).
func TestHandleChunkGivenUp(t *testing.T) {
	t.Parallel()
	rows := []dbq.Row{
		{MsgID: 1, PartitionKey: strp("a")}, {MsgID: 2, PartitionKey: strp("b")}, {MsgID: 3, PartitionKey: strp("c")},
		{MsgID: 4, PartitionKey: strp("a")}, {MsgID: 5, PartitionKey: strp("b")}, {MsgID: 6, PartitionKey: strp("c")},
	}
	for _, tc := range []struct {
		hold bool
		rest []int64
		held int
	}{
		{hold: true, rest: []int64{5, 6}, held: 1},
		{hold: false, rest: []int64{4, 5, 6}, held: 0},
	} {
		giveUp := make(chan struct{})
		var handled []int64
		iv := invoker{
			queue: "q", consumer: "c", logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: metrics.New(nil),
			handler: func(_ context.Context, m *Message) error {
				handled = append(handled, m.ID)
				if m.ID == 3 {
					close(giveUp) // while event 3 runs
				}
				if m.ID == 1 {
					return errors.New("a fails")
				}
				return nil
			},
		}
		run := iv.handleChunk(context.Background(), toMessages(rows, "q", "c", 0), tc.hold, giveUp)
		var rest []int64
		for _, m := range run.rest {
			rest = append(rest, m.ID)
		}
		if run.aborted || run.held != tc.held || len(run.failures) != 1 || !slices.Equal(handled, []int64{1, 2, 3}) || !slices.Equal(rest, tc.rest) {
			t.Errorf("hold %v: handled %v, rest %v, held %d, %d failures, aborted %v; want [1 2 3], %v, %d, 1",
				tc.hold, handled, rest, run.held, len(run.failures), run.aborted, tc.rest, tc.held)
		}
	}
}

func TestMessageKey(t *testing.T) {
	t.Parallel()
	msgs := toMessages([]dbq.Row{{PartitionKey: nil}, {PartitionKey: strp("")}, {PartitionKey: strp("k")}}, "q", "c", 0)
	want := []KeyRef{NullKey, KeyOf(""), KeyOf("k")}
	for i, m := range msgs {
		if m.Key() != want[i] {
			t.Errorf("message %d: Key() = %v, want %v", i, m.Key(), want[i])
		}
	}
	if !NullKey.IsNull() || KeyOf("").IsNull() || NullKey == KeyOf("") {
		t.Error("the NULL key and the empty key are not told apart")
	}
	if (&Message{PartitionKey: "x"}).Key() != KeyOf("x") || (&Message{}).Key() != NullKey {
		t.Error("Key() of a hand-made Message")
	}
	if NullKey.String() != "NULL" || KeyOf("a b").String() != `"a b"` {
		t.Errorf("String() = %s, %s", NullKey, KeyOf("a b"))
	}
	if NullKey.arg() != nil || *KeyOf("").arg() != "" {
		t.Error("arg()")
	}
	for _, p := range []FailurePolicy{FailurePolicySkip, FailurePolicyPause} {
		if got, err := parseFailurePolicy(p.String()); err != nil || got != p {
			t.Errorf("parseFailurePolicy(%q) = %v, %v", p, got, err)
		}
	}
	if _, err := parseFailurePolicy("stop"); err == nil {
		t.Error("parseFailurePolicy accepted an unknown policy")
	}
}
