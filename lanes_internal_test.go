package pgque

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/wakeup"
)

// laneTestConsumer is a PartitionedConsumer with only what the lane
// machinery of one slot needs, and a handler that records the ids it ran,
// in the order it ran them.
type laneTestConsumer struct {
	pc  *PartitionedConsumer
	sl  *slotLanes
	mu  sync.Mutex
	ran []int64
}

func newLaneTestConsumer() *laneTestConsumer {
	lt := &laneTestConsumer{}
	m := metrics.New(nil)
	lt.pc = &PartitionedConsumer{workers: make(chan struct{}, 16), procs: 2,
		invoker: invoker{queue: "q", consumer: "c", logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: m,
			handler: func(_ context.Context, m *Message) error {
				lt.mu.Lock()
				defer lt.mu.Unlock()
				lt.ran = append(lt.ran, m.ID)
				return nil
			}}}
	lt.pc.runningGauge = m.LanesRunning.WithLabelValues("q", "c")
	lt.sl = &slotLanes{held: map[KeyRef]*lane{}, changed: wakeup.NewSignal(), sem: make(chan struct{}, 16)}
	return lt
}

func (lt *laneTestConsumer) handled() []int64 {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return slices.Clone(lt.ran)
}

// chunkOf makes a chunk of events 1, 2, ... with the given keys.
func chunkOf(keys ...string) []*Message {
	rows := make([]dbq.Row, len(keys))
	for i, k := range keys {
		rows[i] = dbq.Row{MsgID: int64(i + 1), PartitionKey: strp(k)}
	}
	return toMessages(rows, "q", "c", 0)
}

func idsOf(msgs []*Message) []int64 {
	ids := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// slowAt puts an inline run in the state fanOut splits: event cur running
// for a second, suspected slow for as long.
func slowAt(in *inlineRun, cur int) {
	long := time.Now().Add(-time.Second)
	in.cur, in.next, in.running, in.started, in.begin, in.suspect = cur, cur, true, long, long, long
}

// A chunk's first split peels off the slow key only: its events become one
// lane, which the running handler's goroutine goes on with, and the other
// keys' later events a new inline run that handles them one after another
// in ev_id order. The split of that run gives every key a lane.
func TestFanOutPeelsTheSlowKeyFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lt := newLaneTestConsumer()
	//               1    2    3    4    5    6    7    8    9
	msgs := chunkOf("a", "b", "c", "s", "a", "b", "s", "c", "a")
	in := lt.pc.newInline(lt.sl, msgs, false)
	slowAt(in, 3) // s's first event
	doneCh := make(chan *lane, len(msgs))
	lanes, rest, _ := lt.pc.fanOut(ctx, lt.sl, nil, in, time.Now(), laneFanOutAfter, doneCh)
	if len(lanes) != 2 {
		t.Fatalf("the first split made %d lanes, want the finished part and the slow key's", len(lanes))
	}
	if got := idsOf(lanes[0].msgs); !slices.Equal(got, []int64{1, 2, 3}) || !lanes[0].finished {
		t.Errorf("finished part %v (finished %v), want [1 2 3]", got, lanes[0].finished)
	}
	if got := idsOf(lanes[1].msgs); lanes[1].key != KeyOf("s") || !slices.Equal(got, []int64{4, 7}) || in.handoff != lanes[1] {
		t.Errorf("head lane %v of key %v (handed off: %v), want s's events [4 7]", got, lanes[1].key, in.handoff == lanes[1])
	}
	if rest == nil || !rest.peeled {
		t.Fatalf("the first split left no peeled inline run of the other keys: %+v", rest)
	}
	if got := idsOf(rest.msgs); !slices.Equal(got, []int64{5, 6, 8, 9}) {
		t.Errorf("the other keys' run has events %v, want [5 6 8 9]", got)
	}
	select {
	case <-rest.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the other keys' inline run did not finish")
	}
	if got := lt.handled(); !slices.Equal(got, []int64{5, 6, 8, 9}) {
		t.Errorf("the other keys' run handled %v, want [5 6 8 9] in that order", got)
	}

	// The peeled run turns slow as well: every key now gets a lane.
	lt2 := newLaneTestConsumer()
	//                1    2    3    4    5    6
	msgs2 := chunkOf("a", "b", "c", "a", "b", "c")
	in2 := lt2.pc.newInline(lt2.sl, msgs2, false)
	in2.peeled = true
	slowAt(in2, 1) // b's first event
	doneCh2 := make(chan *lane, len(msgs2))
	lanes2, rest2, _ := lt2.pc.fanOut(ctx, lt2.sl, nil, in2, time.Now(), laneFanOutAfter, doneCh2)
	if rest2 != nil {
		t.Fatalf("the split of a peeled run left an inline run: %+v", rest2)
	}
	want := map[KeyRef][]int64{KeyOf("b"): {2, 5}, KeyOf("c"): {3, 6}, KeyOf("a"): {4}}
	if len(lanes2) != 4 || lanes2[1].key != KeyOf("b") {
		t.Fatalf("the split of a peeled run made %d lanes (head %v), want the finished part, b's and one for each other key", len(lanes2), lanes2[1].key)
	}
	for _, ln := range lanes2[1:] {
		if got := idsOf(ln.msgs); !slices.Equal(got, want[ln.key]) {
			t.Errorf("lane of %v has events %v, want %v", ln.key, got, want[ln.key])
		}
	}
	for range 2 { // the lanes of a and c run on goroutines of their own
		select {
		case <-doneCh2:
		case <-time.After(10 * time.Second):
			t.Fatal("the other keys' lanes did not finish")
		}
	}
	got := lt2.handled()
	slices.Sort(got)
	if !slices.Equal(got, []int64{3, 4, 6}) {
		t.Errorf("the lanes of a and c handled %v, want [3 4 6]", got)
	}
}

// The run a peel left skips the grace before its own split only while the
// peeled key is still in a long handler: two slow keys at once are slow
// keys; one slow-looking handler after a peeled key that returned at once
// may be a busy process, and is looked at again a grace later.
func TestPeeledRunSplitsAtOnceOnlyBesideASlowKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, headRunning := range []bool{true, false} {
		lt := newLaneTestConsumer()
		msgs := chunkOf("a", "b", "a", "b")
		in := lt.pc.newInline(lt.sl, msgs, false)
		head := &lane{key: KeyOf("s"), msgs: chunkOf("s"), results: make([]error, 1)}
		if headRunning {
			head.running, head.started = true, time.Now().Add(-time.Second)
		}
		in.peeled, in.peeledFrom = true, head
		slowAt(in, 0)
		in.suspect = time.Time{} // not looked at yet
		doneCh := make(chan *lane, len(msgs))
		lanes, rest, wait := lt.pc.fanOut(ctx, lt.sl, nil, in, time.Now(), laneFanOutAfter, doneCh)
		switch {
		case rest != nil:
			t.Fatalf("head running %v: the split of a peeled run left an inline run", headRunning)
		case headRunning && len(lanes) != 3:
			t.Errorf("beside a slow peeled key: %d lanes, want the split at once (finished part, a, b)", len(lanes))
		case !headRunning && (lanes != nil || wait <= 0 || in.suspect.IsZero()):
			t.Errorf("beside a peeled key that returned: lanes %d, wait %v, suspect %v; want a second look a grace later",
				len(lanes), wait, in.suspect)
		}
		if lanes != nil {
			<-doneCh // b's lane
		}
	}
}
