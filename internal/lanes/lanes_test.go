package lanes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// event is a test event: an id (1, 2, ... in chunk order) and a key.
type event struct {
	id  int
	key string
}

func (e *event) Key() string { return e.key }

// chunkOf makes a chunk of events from+1, from+2, ... with the given keys.
func chunkOf(from int, keys ...string) []*event {
	out := make([]*event, len(keys))
	for i, k := range keys {
		out[i] = &event{id: from + i + 1, key: k}
	}
	return out
}

func idsOf(evs []*event) []int {
	ids := make([]int, len(evs))
	for i, e := range evs {
		ids[i] = e.id
	}
	return ids
}

// host is a Host that records what ran and checks, as it runs, that no two
// handlers of one key overlap (one in flight per key). Events in gate wait
// for their channel before they return; events in fail fail.
type host struct {
	mu       sync.Mutex
	ran      []int
	started  map[int]chan struct{} // closed when the event's handler starts
	inFlight map[string]int
	overlap  []string
	gate     map[int]<-chan struct{}
	fail     map[int]bool
	settled  []Held[*event, string]
	// hook, per event, runs as its handler starts.
	hook     map[int]func()
	settle   chan struct{} // receives one value per SettleHeld
	settleFn func(Held[*event, string]) error
}

func newHost() *host {
	return &host{started: map[int]chan struct{}{}, inFlight: map[string]int{}, gate: map[int]<-chan struct{}{},
		fail: map[int]bool{}, settle: make(chan struct{}, 16), hook: map[int]func(){}}
}

// startedC returns a channel closed when event id's handler starts.
func (h *host) startedC(id int) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.started[id]
	if c == nil {
		c = make(chan struct{})
		h.started[id] = c
	}
	return c
}

func (h *host) Run(ctx context.Context, e *event) error {
	h.mu.Lock()
	if h.inFlight[e.key]++; h.inFlight[e.key] > 1 {
		h.overlap = append(h.overlap, fmt.Sprintf("event %d ran beside another handler of key %q", e.id, e.key))
	}
	c := h.started[e.id]
	if c == nil {
		c = make(chan struct{})
		h.started[e.id] = c
	}
	close(c)
	g := h.gate[e.id]
	hook := h.hook[e.id]
	h.mu.Unlock()
	if hook != nil {
		hook()
	}
	if g != nil {
		select {
		case <-g:
		case <-ctx.Done():
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inFlight[e.key]--
	h.ran = append(h.ran, e.id)
	if h.fail[e.id] {
		return fmt.Errorf("event %d failed", e.id)
	}
	return nil
}

func (h *host) SettleHeld(_ context.Context, held Held[*event, string]) error {
	h.mu.Lock()
	h.settled = append(h.settled, held)
	fn := h.settleFn
	h.mu.Unlock()
	defer func() { h.settle <- struct{}{} }()
	if fn != nil {
		return fn(held)
	}
	return nil
}

func (h *host) handled() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ran)
}

// checkOrder fails t unless every key's events ran in id order (events of
// one key in a chunk, and chunk after chunk) and no handlers of a key
// overlapped.
func (h *host) checkOrder(t *testing.T, evs []*event) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.overlap {
		t.Error(o)
	}
	keyOf := map[int]string{}
	for _, e := range evs {
		keyOf[e.id] = e.key
	}
	last := map[string]int{}
	for _, id := range h.ran {
		k := keyOf[id]
		if id < last[k] {
			t.Errorf("key %q: event %d ran after event %d (ran %v)", k, id, last[k], h.ran)
		}
		last[k] = id
	}
}

func newTestSlot(h *host) *Slot[*event, string] {
	return NewSlot(NewPool(16, 2, 0, nil), Host[*event, string](h), 16, nil, nil)
}

// recv waits for a value on c, failing t after a bound that only a broken
// scheduler reaches.
func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// slowAt puts an inline run in the state split splits: event cur running
// for a second, suspected slow for as long.
func slowAt(in *inlineRun[*event, string], cur int) {
	long := time.Now().Add(-time.Second)
	in.cur, in.next, in.running, in.started, in.begin, in.suspect = cur, cur, true, long, long, long
}

// A split at a slow handler: a run's first split peels off the slow key
// only (its events become one lane, which the running handler's goroutine
// goes on with, and the other keys' later events a new inline run); the
// split of a peeled run gives every key a lane; and a peeled run splits
// without a second look only while the peeled key is still in a long
// handler.
func TestSplit(t *testing.T) {
	t.Parallel()
	type want struct {
		finished []int            // the run's finished part
		lanes    map[string][]int // the other lanes, the head first in heads
		head     string
		rest     []int // events of the new inline run (nil: none)
		again    bool  // not split: look again later, suspecting the run
	}
	for _, tc := range []struct {
		name        string
		keys        []string
		cur         int
		peeled      bool
		peeledSlow  bool // the peeled key's handler still runs, for long
		notSuspect  bool // the run was not found slow at the last look
		wantHandled []int
		want        want
	}{{
		name: "first split peels the slow key",
		//     1    2    3    4    5    6    7    8    9
		keys: []string{"a", "b", "c", "s", "a", "b", "s", "c", "a"}, cur: 3,
		want: want{finished: []int{1, 2, 3}, head: "s", lanes: map[string][]int{"s": {4, 7}}, rest: []int{5, 6, 8, 9}},
		// The other keys' run handles them one after another in order.
		wantHandled: []int{5, 6, 8, 9},
	}, {
		name: "split of a peeled run gives every key a lane",
		//     1    2    3    4    5    6
		keys: []string{"a", "b", "c", "a", "b", "c"}, cur: 1, peeled: true,
		want:        want{finished: []int{1}, head: "b", lanes: map[string][]int{"b": {2, 5}, "c": {3, 6}, "a": {4}}},
		wantHandled: []int{3, 4, 6}, // the lanes of a and c
	}, {
		name: "peeled run beside a slow peeled key splits at once",
		keys: []string{"a", "b", "a", "b"}, peeled: true, peeledSlow: true, notSuspect: true,
		want:        want{finished: []int{}, head: "a", lanes: map[string][]int{"a": {1, 3}, "b": {2, 4}}},
		wantHandled: []int{2, 4},
	}, {
		name: "peeled run beside a peeled key that returned looks again",
		keys: []string{"a", "b", "a", "b"}, peeled: true, notSuspect: true,
		want: want{again: true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHost()
			s := newTestSlot(h)
			evs := chunkOf(0, tc.keys...)
			in := s.newInline(evs, false)
			if tc.peeled {
				head := newLane[*event]("s")
				head.msgs, head.results = chunkOf(100, "s"), make([]error, 1)
				if tc.peeledSlow {
					head.running, head.started = true, time.Now().Add(-time.Second)
				}
				in.peeled, in.peeledFrom = true, head
			}
			slowAt(in, tc.cur)
			if tc.notSuspect {
				in.suspect = time.Time{}
			}
			doneCh := make(chan *lane[*event, string], len(evs))
			sp := s.split(context.Background(), in, time.Now(), FanOutAfter, doneCh)
			if tc.want.again {
				if sp.lanes != nil || sp.wait <= 0 || in.suspect.IsZero() {
					t.Fatalf("lanes %d, wait %v, suspect %v; want a second look a grace later", len(sp.lanes), sp.wait, in.suspect)
				}
				return
			}
			if sp.lanes == nil {
				t.Fatalf("not split (wait %v)", sp.wait)
			}
			if got := idsOf(sp.lanes[0].msgs); !slices.Equal(got, tc.want.finished) || !sp.lanes[0].finished {
				t.Errorf("finished part %v (finished %v), want %v", got, sp.lanes[0].finished, tc.want.finished)
			}
			if len(sp.lanes)-1 != len(tc.want.lanes) {
				t.Fatalf("%d lanes besides the finished part, want %d", len(sp.lanes)-1, len(tc.want.lanes))
			}
			if sp.lanes[1].key != tc.want.head || in.handoff != sp.lanes[1] {
				t.Errorf("head lane of key %q (handed off: %v), want %q", sp.lanes[1].key, in.handoff == sp.lanes[1], tc.want.head)
			}
			for _, ln := range sp.lanes[1:] {
				if got := idsOf(ln.msgs); !slices.Equal(got, tc.want.lanes[ln.key]) {
					t.Errorf("lane of %q has events %v, want %v", ln.key, got, tc.want.lanes[ln.key])
				}
			}
			if tc.want.rest == nil {
				if sp.rest != nil {
					t.Fatalf("left an inline run of %v", idsOf(sp.rest.msgs))
				}
				for range sp.lanes[2:] { // the other lanes run on goroutines of their own
					recv(t, doneCh, "the other keys' lanes")
				}
			} else {
				if sp.rest == nil || !sp.rest.peeled || sp.rest.peeledFrom != sp.lanes[1] {
					t.Fatalf("left no peeled inline run of the other keys: %+v", sp.rest)
				}
				if got := idsOf(sp.rest.msgs); !slices.Equal(got, tc.want.rest) {
					t.Errorf("the other keys' run has events %v, want %v", got, tc.want.rest)
				}
				recv(t, sp.rest.done, "the other keys' inline run")
			}
			got := h.handled()
			if tc.want.rest == nil {
				slices.Sort(got)
			}
			if !slices.Equal(got, tc.wantHandled) {
				t.Errorf("handled %v, want %v", got, tc.wantHandled)
			}
		})
	}
}

// Run keeps each key's events in order and one at a time, whatever splits
// the chunk's handlers cause, and a slow key does not keep the chunk's other
// keys waiting: its handler returns only once every other event ran, which
// needs a split. Under pause, a failed key's later events are not handled.
func TestRunOrderAndOneInFlightPerKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		keys  []string
		slow  []int // events that return only when all events of other keys ran
		fail  []int
		pause bool
		// wantSkipped are the events not handled (pause).
		wantSkipped []int
		wantFailed  []int
	}{
		{name: "fast", keys: []string{"a", "b", "a", "c", "b", "a"}},
		{name: "one slow key", keys: []string{"a", "s", "b", "s", "a", "c", "b"}, slow: []int{2}},
		{name: "slow key first", keys: []string{"s", "a", "b", "a", "s", "b"}, slow: []int{1}},
		{name: "failure under retry", keys: []string{"a", "b", "a", "b"}, fail: []int{1}, wantFailed: []int{1}},
		{name: "failure under pause stops the key", keys: []string{"a", "b", "a", "b", "a"}, fail: []int{1}, pause: true,
			wantFailed: []int{1}, wantSkipped: []int{3, 5}},
		{name: "failure under pause in a peeled lane", keys: []string{"s", "a", "s", "a", "s"}, slow: []int{1}, fail: []int{1},
			pause: true, wantFailed: []int{1}, wantSkipped: []int{3, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHost()
			evs := chunkOf(0, tc.keys...)
			for _, id := range tc.fail {
				h.fail[id] = true
			}
			for _, id := range tc.slow {
				// The slow handler returns once every event of another key
				// has started: that happens only beside it, in a split.
				key := evs[id-1].key
				gate := make(chan struct{})
				var others []<-chan struct{}
				for _, e := range evs {
					if e.key != key {
						others = append(others, h.startedC(e.id))
					}
				}
				go func() {
					for _, c := range others {
						<-c
					}
					close(gate)
				}()
				h.gate[id] = gate
			}
			s := newTestSlot(h)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := s.Run(ctx, evs, tc.pause)
			if ctx.Err() != nil {
				t.Fatal("the chunk did not finish: a slow key kept the others waiting")
			}
			c.Unhold() // a slow handler may have been held: wait for it
			if c.Aborted() {
				t.Fatal("chunk aborted")
			}
			h.checkOrder(t, evs)
			var failed []int
			for _, f := range c.Failures() {
				failed = append(failed, f.Msg.id)
			}
			if !slices.Equal(failed, tc.wantFailed) {
				t.Errorf("failures %v, want %v", failed, tc.wantFailed)
			}
			ran := h.handled()
			for _, e := range evs {
				if slices.Contains(ran, e.id) == slices.Contains(tc.wantSkipped, e.id) {
					t.Errorf("event %d: handled %v, want %v", e.id, slices.Contains(ran, e.id), !slices.Contains(tc.wantSkipped, e.id))
				}
			}
		})
	}
}

// A lane still running HoldAfter after the rest of its chunk finished is
// held: the chunk reports the hold from the running event on, and its
// failures without the held ones. What becomes of the held lane depends on
// whether the hold lands: detached, it settles its key itself (and the
// slot's next chunk waits for it before handling that key); unheld, it
// finishes as part of the chunk; abandoned, it settles nothing.
func TestHolds(t *testing.T) {
	t.Parallel()
	for _, then := range []string{"detach", "unhold", "abandon", "settle fails"} {
		t.Run(then, func(t *testing.T) {
			t.Parallel()
			h := newHost()
			//                 1    2    3    4    5
			evs := chunkOf(0, "a", "s", "b", "s", "s")
			release := make(chan struct{})
			h.gate[2] = release
			h.fail[1], h.fail[4] = true, true
			if then == "settle fails" {
				h.settleFn = func(Held[*event, string]) error { return errors.New("cannot settle") }
			}
			s := newTestSlot(h)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := s.Run(ctx, evs, false)
			holds := c.Holds()
			if len(holds) != 1 || holds[0].Key != "s" || holds[0].Head.id != 2 {
				t.Fatalf("holds %+v, want key s from event 2", holds)
			}
			if fs := c.Failures(); len(fs) != 1 || fs[0].Msg.id != 1 {
				t.Fatalf("chunk failures %+v, want event 1's only (s is held)", fs)
			}
			switch then {
			case "detach", "settle fails":
				c.Detach()
				if n := s.Holding(); n != 1 {
					t.Fatalf("slot holds %d keys, want 1", n)
				}
				if st := s.Stats(func(*event) time.Time { return time.Unix(2, 0) }); st.HeldKeys != 1 || st.Queued != 3 || st.Oldest != time.Unix(2, 0) {
					t.Errorf("stats %+v, want one key, 3 events queued", st)
				}
				// The next chunk's s event waits for the held lane (the
				// host reports an overlap otherwise); its c event runs.
				next := chunkOf(5, "c", "s")
				nextDone := make(chan *Chunk[*event, string])
				go func() { nextDone <- s.Run(ctx, next, false) }()
				recv(t, h.startedC(6), "event 6 of the next chunk")
				close(release)
				c2 := recv(t, nextDone, "the next chunk")
				recv(t, h.settle, "the held key's settlement")
				s.Wait()
				h.checkOrder(t, append(slices.Clone(evs), next...))
				if c2.Aborted() || len(c2.Holds()) != 0 {
					t.Errorf("next chunk aborted %v, holds %d", c2.Aborted(), len(c2.Holds()))
				}
				held := h.settled[0]
				if held.Key != "s" || held.Head.id != 2 || !slices.Equal(idsOf(held.Handled), []int{2, 4, 5}) ||
					held.Results[0] != nil || held.Results[1] == nil || held.Results[2] != nil {
					t.Errorf("settled %+v, want s's events 2, 4 (failed), 5", held)
				}
				room, err := s.WaitRoom(ctx, 1, 1)
				if then == "settle fails" {
					if room || err == nil {
						t.Errorf("a key that could not be settled left the slot usable: room %v, err %v", room, err)
					}
				} else if !room || err != nil || s.Holding() != 0 {
					t.Errorf("after settling: room %v, err %v, holding %d", room, err, s.Holding())
				}
			case "unhold":
				close(release)
				c.Unhold()
				if len(c.Holds()) != 0 {
					t.Error("holds left after Unhold")
				}
				if fs := c.Failures(); len(fs) != 2 || fs[1].Msg.id != 4 {
					t.Errorf("failures after Unhold %+v, want events 1 and 4", fs)
				}
				if len(h.settled) != 0 || s.Holding() != 0 {
					t.Errorf("an unheld lane settled its key (%d) or stayed held (%d)", len(h.settled), s.Holding())
				}
			case "abandon":
				cancel()
				c.Abandon()
				if len(h.settled) != 0 || s.Holding() != 0 {
					t.Errorf("an abandoned lane settled its key (%d) or stayed held (%d)", len(h.settled), s.Holding())
				}
				if slices.Contains(h.handled(), 4) {
					t.Error("the abandoned lane went on after its context ended")
				}
			}
		})
	}
}

// A hot key's many fast events are held though no single handler is slow,
// so that the slot fetches on: as soon as its events left would take
// busyHoldFactor hold times at its handlers' mean, or once it has kept the
// chunk open that long; a share of the chunk shorter than that is waited
// for. Each "h" handler takes a few ms (past FanOutAfter: the chunk splits),
// none near the hold time.
func TestBusyLaneIsHeld(t *testing.T) {
	t.Parallel()
	run := func(holdAfter time.Duration, cost []time.Duration) (*host, *Slot[*event, string], *Chunk[*event, string], []*event) {
		h := newHost()
		keys := []string{"c"}
		for range cost {
			keys = append(keys, "h")
		}
		evs := chunkOf(0, keys...)
		for i, e := range evs[1:] {
			h.hook[e.id] = func() { time.Sleep(cost[i]) }
		}
		s := NewSlot(NewPool(16, 2, holdAfter, nil), Host[*event, string](h), 16, nil, nil)
		return h, s, s.Run(context.Background(), evs, false), evs
	}
	costs := func(n int, d time.Duration) []time.Duration { return slices.Repeat([]time.Duration{d}, n) }
	held := func(t *testing.T, h *host, s *Slot[*event, string], c *Chunk[*event, string], evs []*event, most int) {
		t.Helper()
		n := len(evs)
		holds := c.Holds()
		ran := len(h.handled())
		if len(holds) != 1 || holds[0].Key != "h" {
			t.Fatalf("holds %+v, want key h (%d of %d events ran before the chunk settled)", holds, ran, n)
		}
		if ran > most {
			t.Errorf("the chunk settled after %d of its %d events, want at most %d: the hot key kept it open", ran, n, most)
		}
		head := holds[0].Head.id
		c.Detach()
		recv(t, h.settle, "the held key's settlement")
		s.Wait()
		h.checkOrder(t, evs)
		settled := h.settled[0]
		if settled.Head.id != head || len(settled.Handled) != n-head+1 || settled.Handled[0].id != head {
			t.Errorf("settled from %d with %d events, want from %d with %d", settled.Head.id, len(settled.Handled), head, n-head+1)
		}
		if got := len(h.handled()); got != n {
			t.Errorf("%d events ran, want %d", got, n)
		}
	}
	t.Run("events left", func(t *testing.T) {
		t.Parallel()
		// 10 ms hold time: 200 events of 3 ms have 100 ms left from their
		// first handlers on; the hold comes with the first look, 10 ms in
		// (after about 33 events when only the chunk's open time counts).
		h, s, c, evs := run(10*time.Millisecond, costs(200, 3*time.Millisecond))
		held(t, h, s, c, evs, 15)
	})
	t.Run("kept open", func(t *testing.T) {
		t.Parallel()
		// 30 events of 1 ms, then 30 of 5 ms: at the mean so far, what is
		// left never looks like 100 ms, but the chunk is open for 180 ms.
		h, s, c, evs := run(10*time.Millisecond, append(costs(30, time.Millisecond), costs(30, 5*time.Millisecond)...))
		held(t, h, s, c, evs, 60)
	})
	t.Run("not held", func(t *testing.T) {
		t.Parallel()
		// The default hold time: 20 events (60 ms) finish long before 500 ms.
		h, s, c, evs := run(0, costs(20, 3*time.Millisecond))
		if holds := c.Holds(); len(holds) != 0 {
			t.Fatalf("holds %+v, want none: the chunk was open for less than %d hold times", holds, busyHoldFactor)
		}
		s.Wait()
		h.checkOrder(t, evs)
		if got := len(h.handled()); got != 21 {
			t.Errorf("%d events ran, want 21", got)
		}
	})
}

// aheadAt: a lane running a handler whose events left would take ten hold
// times at the mean of its own handlers (two at least) is held without
// waiting for them to keep the chunk open.
func TestAheadAt(t *testing.T) {
	t.Parallel()
	hold := 10 * time.Millisecond
	for _, tc := range []struct {
		name         string
		events, next int
		runs         int
		ranFor       time.Duration
		running      bool
		want         bool
	}{
		{"34 left at 3 ms", 40, 6, 6, 18 * time.Millisecond, true, true},
		{"33 left at 3 ms", 40, 7, 7, 21 * time.Millisecond, true, false},
		{"one handler is no mean", 400, 1, 1, 3 * time.Millisecond, true, false},
		{"between two handlers", 400, 6, 6, 18 * time.Millisecond, false, false},
	} {
		ln := &lane[*event, string]{msgs: chunkOf(0, slices.Repeat([]string{"h"}, tc.events)...), next: tc.next,
			runs: tc.runs, ranFor: tc.ranFor, running: tc.running, started: time.Now()}
		if got := ln.aheadAt(hold); got != tc.want {
			t.Errorf("%s: ahead %v, want %v", tc.name, got, tc.want)
		}
		if got := ln.holdableAt(time.Now(), hold); got != tc.want {
			t.Errorf("%s: holdable %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A slot being given up hands back what it has not started: every key not
// through its events is held from the event it runs or the first it has
// not started, Run returns without waiting for the rest, and the keys whose
// lanes ran an event since the hold are settled with it (the host releases
// the rest); the others are left to the slot's next owner. Three
// ways a chunk can be caught: in its inline run between two events, in a
// slow lane, and in lanes waiting for a place.
func TestHandBack(t *testing.T) {
	t.Parallel()
	type want struct {
		ran     []int
		holds   map[string]int   // key: head
		handled map[string][]int // the keys settled: what each settlement reports
	}
	for _, tc := range []struct {
		name   string
		keys   []string
		places int
		// setup sets gates and hooks: back gives the slot up, gate is
		// what gated events wait for (it opens after Run returned).
		setup func(h *host, back func(), gate <-chan struct{})
		want  want
	}{{
		name: "inline run between two events",
		//               1    2    3    4    5    6
		keys: []string{"a", "b", "c", "a", "b", "c"}, places: 16,
		setup: func(h *host, back func(), _ <-chan struct{}) { h.hook[2] = back },
		want:  want{ran: []int{1, 2}, holds: map[string]int{"c": 3, "a": 4, "b": 5}, handled: map[string][]int{}},
	}, {
		name: "a slow lane stops after its running event",
		//               1    2    3    4    5
		keys: []string{"s", "a", "s", "a", "s"}, places: 16,
		setup: func(h *host, back func(), gate <-chan struct{}) {
			h.gate[1] = gate
			h.hook[4] = back // a's inline run is done: only s's lane is left
		},
		want: want{ran: []int{2, 4}, holds: map[string]int{"s": 1}, handled: map[string][]int{"s": {1}}},
	}, {
		name: "lanes waiting for a place",
		//               1    2    3    4    5    6
		keys: []string{"s", "t", "a", "b", "a", "b"}, places: 2,
		setup: func(h *host, back func(), gate <-chan struct{}) {
			// s and t are slow and keep both places: a and b, split off
			// once t is found slow, wait for one.
			h.gate[1], h.gate[2] = gate, gate
			h.hook[2] = back
		},
		want: want{ran: nil, holds: map[string]int{"s": 1, "t": 2, "a": 3, "b": 4},
			handled: map[string][]int{"s": {1}, "t": {2}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHost()
			evs := chunkOf(0, tc.keys...)
			backC := make(chan struct{})
			var once sync.Once
			gate := make(chan struct{})
			tc.setup(h, func() { once.Do(func() { close(backC) }) }, gate)
			s := NewSlot(NewPool(16, 2, 0, nil), Host[*event, string](h), tc.places, nil, backC)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := s.Run(ctx, evs, false)
			if ran := h.handled(); !slices.Equal(ran, tc.want.ran) {
				t.Errorf("ran %v before Run returned, want %v", ran, tc.want.ran)
			}
			holds := map[string]int{}
			for _, hd := range c.Holds() {
				holds[hd.Key] = hd.Head.id
			}
			if fmt.Sprint(holds) != fmt.Sprint(tc.want.holds) {
				t.Errorf("holds %v, want %v", holds, tc.want.holds)
			}
			if c.Aborted() || len(c.Failures()) != 0 {
				t.Errorf("aborted %v, failures %v", c.Aborted(), c.Failures())
			}
			c.Detach()
			close(gate)
			for range tc.want.handled {
				recv(t, h.settle, "a held key's settlement")
			}
			s.Wait()
			h.mu.Lock()
			handled := map[string][]int{}
			for _, st := range h.settled {
				handled[st.Key] = idsOf(st.Handled)
				if st.Head.id != tc.want.holds[st.Key] {
					t.Errorf("key %s settled from %d, held from %d", st.Key, st.Head.id, tc.want.holds[st.Key])
				}
			}
			h.mu.Unlock()
			if fmt.Sprint(handled) != fmt.Sprint(tc.want.handled) {
				t.Errorf("settlements report %v handled, want %v", handled, tc.want.handled)
			}
			h.checkOrder(t, evs)
		})
	}
}
