package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pgque/pgque"
)

// Online resize: how long Client.ResizeSlots takes from the call to the
// new N working, and how long the stream stops meanwhile, for a
// PartitionedConsumer (defaults, Go Ticker at 10 ms) going 8 -> 16 -> 8
// slots.
//
// backlog: a backlog of events is sent first; the consumer starts and the
// resize is called at once, so the old slots must drain the whole backlog
// (everything up to the seal) before the new ones start; 1000 more events
// are sent right after the call, for the new slots. steady: a producer
// sends 1000 ev/s and the consumer keeps up; the resize is called mid-
// stream. Per resize: drain (call -> resize_status reports the old slots
// past the seal; polled every 20 ms, so it is never below one poll), to new N (call -> first event handled by a new slot) and the cutover gap
// between the two, the pause the protocol adds on top of draining the old
// slots (target under 1 s); for the steady stream also the longest gap
// between two handled events.

func init() {
	register(&suite{
		name:  "resize",
		about: "online resize 8 -> 16 -> 8 of a PartitionedConsumer: time to the new N and the pause, with a backlog and with a 1000 ev/s stream",
		run:   runResize,
	})
}

// handledLog records when each event was handled and by which N.
type handledLog struct {
	mu sync.Mutex
	at []time.Time
	n  []int
}

func (h *handledLog) handler(ctx context.Context, m *pgque.Message) error {
	h.mu.Lock()
	h.at = append(h.at, time.Now())
	h.n = append(h.n, m.NSlots)
	h.mu.Unlock()
	return nil
}

func (h *handledLog) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.at)
}

// resizeTimes measures one resize from call: the first handling under to
// after call, the gap from the last handling under from, and the longest
// gap between handlings from call on. The drain comes from the resize's
// own status (see resizeAndWait): in a steady stream the old slots may have
// nothing left at the call, so no handling marks its end.
type resizeTimes struct {
	drain, toNew, gap, maxGap time.Duration
}

func (h *handledLog) times(call, drained time.Time, from, to int) resizeTimes {
	h.mu.Lock()
	defer h.mu.Unlock()
	var lastOld, firstNew, prev time.Time
	var rt resizeTimes
	for i, at := range h.at {
		if at.Before(call) {
			continue
		}
		if h.n[i] == from && at.After(lastOld) {
			lastOld = at
		}
		if h.n[i] == to && (firstNew.IsZero() || at.Before(firstNew)) {
			firstNew = at
		}
		if !prev.IsZero() && at.Sub(prev) > rt.maxGap {
			rt.maxGap = at.Sub(prev)
		}
		prev = at
	}
	if lastOld.IsZero() {
		lastOld = call
	}
	rt.drain, rt.toNew = drained.Sub(call), firstNew.Sub(call)
	rt.gap = firstNew.Sub(lastOld)
	return rt
}

// resizeAndWait resizes and waits until pc works n slots and an event was
// handled under n. It returns the time of the call and the time it first
// saw the resize past its draining phase.
// tail > 0 sends that many events right after the call (a backlog case has
// no producer, and the new slots need events after the seal).
func resizeAndWait(ctx context.Context, client *pgque.Client, pc *pgque.PartitionedConsumer, h *handledLog, q string, n, tail int) (call, drained time.Time, err error) {
	call = time.Now()
	if err := client.ResizeSlots(ctx, q, "rs", n); err != nil {
		return call, drained, err
	}
	if tail > 0 {
		if err := sendResizeEvents(ctx, client, q, tail); err != nil {
			return call, drained, err
		}
	}
	var pollErr error
	ok := waitFor(ctx, 5*time.Minute, func() bool {
		if drained.IsZero() {
			rs, err := client.Resizes(ctx, q)
			if err != nil {
				pollErr = err
				return true
			}
			if i := slices.IndexFunc(rs, func(r pgque.Resize) bool { return r.Consumer == "rs" }); i >= 0 && rs[i].Phase != pgque.ResizeDraining {
				drained = time.Now()
			}
		}
		if drained.IsZero() || pc.Slots() != n {
			return false
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.n) > 0 && h.n[len(h.n)-1] == n
	})
	if pollErr != nil {
		return call, drained, pollErr
	}
	if !ok {
		return call, drained, fmt.Errorf("the resize to %d did not complete within 5 minutes", n)
	}
	return call, drained, nil
}

func runResize(ctx context.Context, e *env, r *recorder) error {
	p, client, stop, err := heldBase(ctx, e, "bench_resize")
	if err != nil {
		return err
	}
	defer stop()
	backlog := pick(e, 20000, 100000)
	for _, mode := range []string{"backlog", "steady"} {
		if err := resizeCase(ctx, client, p.fresh("resize"), mode, backlog, r); err != nil {
			return err
		}
	}
	return nil
}

// resizeCase runs 8 -> 16 -> 8 on a fresh queue. In backlog mode the pool
// is stopped before each resize while the backlog is sent, then started
// and resized at once, so the whole backlog is pending at the call.
func resizeCase(ctx context.Context, client *pgque.Client, q, mode string, backlog int, r *recorder) error {
	if _, err := client.CreateQueue(ctx, q); err != nil {
		return err
	}
	if _, err := client.SubscribeSlots(ctx, q, "rs", 8, 0); err != nil {
		return err
	}
	h := &handledLog{}
	var pc *pgque.PartitionedConsumer
	stopPool := func() {
		if pc != nil {
			pc.Stop(context.WithoutCancel(ctx))
			pc = nil
		}
	}
	defer stopPool()
	startPool := func() error {
		var err error
		pc, err = client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: q, Consumer: "rs", Slots: 8, Handler: h.handler})
		if err != nil {
			return err
		}
		return pc.Start(ctx)
	}
	stopProducer := func() {}
	if mode == "steady" {
		stopProducer = produceSteady(ctx, client, q, 1000)
		defer stopProducer()
		if err := startPool(); err != nil {
			return err
		}
		if !waitFor(ctx, 30*time.Second, func() bool { return h.count() > 3000 }) {
			return fmt.Errorf("the consumer did not handle the steady stream")
		}
	}
	for _, step := range [][2]int{{8, 16}, {16, 8}} {
		tail := 0
		if mode == "backlog" {
			stopPool()
			if err := sendResizeEvents(ctx, client, q, backlog); err != nil {
				return err
			}
			if err := startPool(); err != nil { // configured with 8: follows the consumer's N
				return err
			}
			tail = 1000
		}
		call, drained, err := resizeAndWait(ctx, client, pc, h, q, step[1], tail)
		if err != nil {
			return err
		}
		if mode == "steady" {
			time.Sleep(2 * time.Second) // the gap statistics cover the catch-up
		}
		rt := h.times(call, drained, step[0], step[1])
		name := fmt.Sprintf("resize %s %d->%d", mode, step[0], step[1])
		note := fmt.Sprintf("%d events pending at the call", backlog)
		if mode == "steady" {
			note = "1000 ev/s stream"
		}
		r.add(name+" drain", single(rt.drain.Seconds()), "s", nil, "call to the old slots past the seal (resize_status, polled every 20 ms); "+note)
		r.add(name+" to new N", single(rt.toNew.Seconds()), "s", nil, "call to the first event handled by a new slot")
		r.add(name+" cutover gap", single(rt.gap.Seconds()), "s", valueAtMost(1), "last old-slot event to first new-slot event")
		if mode == "steady" {
			r.add(name+" max gap", single(rt.maxGap.Seconds()), "s", nil, "longest pause between two handled events after the call")
		}
	}
	return nil
}

// sendResizeEvents sends n events over 1000 keys in batches of 1000.
func sendResizeEvents(ctx context.Context, client *pgque.Client, q string, n int) error {
	for off := 0; off < n; off += 1000 {
		events := make([]pgque.Event, min(1000, n-off))
		for i := range events {
			events[i] = pgque.Event{Type: "e", Payload: off + i, PartitionKey: fmt.Sprintf("tenant-%d", (off+i)%1000)}
		}
		if _, err := client.SendBatch(ctx, q, events); err != nil {
			return err
		}
	}
	return nil
}

// produceSteady sends rate events per second (batches of 10) until the
// returned stop is called.
func produceSteady(ctx context.Context, client *pgque.Client, q string, rate int) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(time.Second * 10 / time.Duration(rate))
		defer tk.Stop()
		seq := 0
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			events := make([]pgque.Event, 10)
			for i := range events {
				events[i] = pgque.Event{Type: "e", Payload: seq, PartitionKey: fmt.Sprintf("tenant-%d", seq%1000)}
				seq++
			}
			_, _ = client.SendBatch(ctx, q, events)
		}
	}()
	return func() { close(done); wg.Wait() }
}
