package pgque_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// replayed is one handler call, as a replay test records it.
type replayed struct {
	id      int64
	key     string
	replay  bool
	retries int
}

// deliveries records handler calls for the replay tests.
type deliveries struct {
	mu  sync.Mutex
	all []replayed
}

func (d *deliveries) add(m *pgque.Message) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, replayed{id: m.ID, key: m.PartitionKey, replay: m.Replay, retries: m.RetryCount})
}

// of returns the recorded deliveries of key, in order.
func (d *deliveries) of(key string) []replayed {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []replayed
	for _, x := range d.all {
		if x.key == key {
			out = append(out, x)
		}
	}
	return out
}

// deadLetterOf returns key's dead letter, if there is one.
func deadLetterOf(t *testing.T, env *testEnv, key string) (pgque.DeadLetterEntry, bool) {
	t.Helper()
	dls, err := env.client.DeadLetters(context.Background(), env.queue, &pgque.DeadLetterFilter{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dls {
		if d.Key == pgque.KeyOf(key) {
			return d, true
		}
	}
	return pgque.DeadLetterEntry{}, false
}

// TestReplayDeadLetterMarksAndReports replays dead letters of a
// partitioned consumer under the skip policy: the replay reaches the
// handler marked, with its id and retry count kept, its own retries stay
// marked, and the report says when the consumer had already been handed a
// later event of the key (key f) and when not (key g).
func TestReplayDeadLetterMarksAndReports(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if err := env.client.SetQueueConfig(ctx, env.queue, pgque.QueueMaxRetries(1)); err != nil {
		t.Fatal(err)
	}
	startTicker(t, env.client)
	var rec deliveries
	startProcess(t, env, pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, WorkerID: "solo",
		RetryDelay: func(int) time.Duration { return 0 },
		Handler: func(_ context.Context, m *pgque.Message) error {
			rec.add(m)
			switch {
			case m.Type == "bad" && !m.Replay:
				return errors.New("fails until replayed")
			case m.Type == "fatal" && !m.Replay:
				return pgque.DeadLetter(errors.New("dead-lettered at once"))
			case m.Type == "fatal":
				return errors.New("the replay fails too")
			}
			return nil
		},
	})
	send := func(key, typ string) int64 {
		id, err := env.client.Send(ctx, env.queue, pgque.Event{Type: typ, PartitionKey: key, Payload: 1})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	fBad := send("f", "bad")
	fLater := send("f", "ok")
	gBad := send("g", "bad")
	hFatal := send("h", "fatal")

	var fDL, gDL, hDL pgque.DeadLetterEntry
	pgtest.WaitFor(t, 30*time.Second, "the dead letters of f, g and h and f's later event", func() bool {
		var okF, okG, okH bool
		fDL, okF = deadLetterOf(t, env, "f")
		gDL, okG = deadLetterOf(t, env, "g")
		hDL, okH = deadLetterOf(t, env, "h")
		return okF && okG && okH && len(rec.of("f")) == 3
	})
	if fDL.EventID != fBad || fDL.RetryCount != 1 || hDL.RetryCount != 0 {
		t.Fatalf("dead letters f %+v, h %+v: want f's event %d with 1 retry, h with none", fDL, hDL, fBad)
	}

	rf, err := env.client.ReplayDeadLetterReport(ctx, env.queue, fDL.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rf.EventID != fBad || rf.LaterDelivered != 1 || !rf.HistoryComplete || !rf.OutOfOrder() {
		t.Fatalf("replaying f = %+v: want event %d, 1 later event (%d) already delivered", rf, fBad, fLater)
	}
	rg, err := env.client.ReplayDeadLetterReport(ctx, env.queue, gDL.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rg.EventID != gBad || rg.LaterDelivered != 0 || !rg.HistoryComplete || rg.OutOfOrder() {
		t.Fatalf("replaying g = %+v: want event %d and nothing later delivered", rg, gBad)
	}
	if id, err := env.client.ReplayDeadLetter(ctx, env.queue, hDL.ID); err != nil || id != hFatal {
		t.Fatalf("replaying h = %d, %v; want %d", id, err, hFatal)
	}

	pgtest.WaitFor(t, 30*time.Second, "the replays of f and g handled and h dead again", func() bool {
		_, dead := deadLetterOf(t, env, "h")
		return len(rec.of("f")) == 4 && len(rec.of("g")) == 3 && len(rec.of("h")) == 3 && dead
	})
	want := map[string][]replayed{
		"f": {{fBad, "f", false, 0}, {fLater, "f", false, 0}, {fBad, "f", false, 1}, {fBad, "f", true, 1}},
		"g": {{gBad, "g", false, 0}, {gBad, "g", false, 1}, {gBad, "g", true, 1}},
		// Dead at once with no retry, h's replay has max_retries (1)
		// retry left, and its retry is still a replay.
		"h": {{hFatal, "h", false, 0}, {hFatal, "h", true, 0}, {hFatal, "h", true, 1}},
	}
	for key, w := range want {
		got := rec.of(key)
		// f's later event may overtake its first failure (skip policy).
		if key == "f" && got[0].id == fLater {
			got[0], got[1] = got[1], got[0]
		}
		for i := range w {
			if got[i] != w[i] {
				t.Fatalf("deliveries of %s = %+v, want %+v", key, got, w)
			}
		}
	}
	if d, _ := deadLetterOf(t, env, "h"); d.RetryCount != 1 {
		t.Fatalf("h dead again with %d retries, want 1", d.RetryCount)
	}
}
