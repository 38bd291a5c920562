package pgque

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/dbq"
)

// A tick wakes the slots it touched at once (docs/design.md, "Wake-ups
// proportional to work"), and each woken slot makes its own receive: one
// round trip, one transaction and one commit per slot. With
// GatherReceives the receives of slots that wake from a wait are gathered
// here for a short window and made as one call
// (receive_partitioned_raw_slots), so a tick that wakes four slots of a
// process costs the server one transaction instead of four. The call
// serves its slots one after another, which is why it is not the default:
// the last slot's chunk waits for the others' (docs/design.md, item 8).
//
// A slot receiving chunk after chunk (a backlog) does not wait for the
// window: its receives go out alone, at once and in parallel with the
// other slots', as before.

// gatherWindowDefault is how long the first woken receive waits for the
// others of its wake-up. The slots of one notification reach their
// receive within tens of microseconds of each other; a tick is 10 ms.
// (docs/benchmarks.md, "One call for the slots a tick wakes", has the
// measurements.)
const gatherWindowDefault = 200 * time.Microsecond

// receiveGather gathers woken slots' receives into calls.
type receiveGather struct {
	window time.Duration
	// single receives one slot; many receives several in one call, all
	// or nothing.
	single func(ctx context.Context, call dbq.SlotReceive) ([]dbq.Row, error)
	many   func(ctx context.Context, calls []dbq.SlotReceive) ([][]dbq.Row, error)
	// log says when a gathered call failed and its slots asked alone.
	log *slog.Logger
	// calls counts the calls made for more than one slot (tests).
	calls atomic.Int64
	// off is set when the server has no receive_partitioned_raw_slots (an
	// older install): from then on every slot receives alone, at once.
	off atomic.Bool

	mu      sync.Mutex
	pending []*gathered
}

// gathered is one slot's receive waiting for its call.
type gathered struct {
	call    dbq.SlotReceive
	workCtx context.Context
	done    chan gatheredResult
}

type gatheredResult struct {
	rows []dbq.Row
	err  error
}

// receive makes call with the receives of other slots that arrive within
// the window. It returns when the call is answered or workCtx ends. A
// stop (fetchCtx) that comes after the receive joined a call does not
// cancel it: the call may carry other slots' acknowledgements, and the
// chunk it brings is the slot's to handle, as one received just before
// the stop would be.
func (g *receiveGather) receive(fetchCtx, workCtx context.Context, call dbq.SlotReceive) ([]dbq.Row, error) {
	if err := fetchCtx.Err(); err != nil {
		return nil, err
	}
	if g.off.Load() {
		return g.single(fetchCtx, call)
	}
	r := &gathered{call: call, workCtx: workCtx, done: make(chan gatheredResult, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	if len(g.pending) == 1 {
		time.AfterFunc(g.window, g.flush)
	}
	g.mu.Unlock()
	select {
	case res := <-r.done:
		return res.rows, res.err
	case <-workCtx.Done():
		return nil, context.Cause(workCtx)
	}
}

// flush makes the call for the receives gathered in the window.
func (g *receiveGather) flush() {
	g.mu.Lock()
	batch := g.pending
	g.pending = nil
	g.mu.Unlock()

	// The call runs until it is answered, or until every slot in it is
	// fenced or hard-stopped.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	left := int32(len(batch))
	for _, r := range batch {
		stop := context.AfterFunc(r.workCtx, func() {
			if atomic.AddInt32(&left, -1) == 0 {
				cancel()
			}
		})
		defer stop()
	}

	if len(batch) == 1 {
		rows, err := g.single(ctx, batch[0].call)
		batch[0].done <- gatheredResult{rows, err}
		return
	}
	calls := make([]dbq.SlotReceive, len(batch))
	for i, r := range batch {
		calls[i] = r.call
	}
	g.calls.Add(1)
	chunks, err := g.many(ctx, calls)
	if err == nil {
		for i, r := range batch {
			r.done <- gatheredResult{rows: chunks[i]}
		}
		return
	}
	if ctx.Err() != nil {
		for _, r := range batch {
			r.done <- gatheredResult{err: err}
		}
		return
	}
	// One slot's failure (its lease lost, say) failed the call and left
	// everything as it was: each slot asks alone, and learns its own
	// answer.
	if dbq.UndefinedFunction(err) {
		g.off.Store(true)
	}
	g.log.Debug("pgque: a gathered receive failed; each of its slots asks alone", slog.Int("slots", len(batch)),
		slog.Bool("gathering_off", g.off.Load()), slog.Any("error", err))
	var wg sync.WaitGroup
	for _, r := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows, err := g.single(r.workCtx, r.call)
			r.done <- gatheredResult{rows, err}
		}()
	}
	wg.Wait()
}
