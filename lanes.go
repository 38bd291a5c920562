package pgque

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/wakeup"
	"github.com/pgque/pgque/internal/workerpool"
)

// Key lanes (see docs/worker-pool.md). A slot's chunk first runs on one
// goroutine, event after event in ev_id order, as a slot without lanes
// does: while handlers are fast that is the cheapest way through a chunk.
// Once a handler has run for laneFanOutAfter, its key is peeled off into a
// lane: the running event's key goes on in the goroutine that runs it,
// and the chunk's other keys go on inline on a new goroutine. If one of
// those turns slow as well, the rest is split by partition key: every key
// gets a goroutine that runs its events one at a time in ev_id order, and
// the lanes run concurrently, bounded by a per-slot and a per-process
// semaphore. When
// all lanes of a chunk are done the chunk is settled as before. When only
// a few lanes have been left running for laneHoldAfter, the keys of those
// running a handler are held on the server (their unfinished events
// deferred, later ones deferred on receipt) and the chunk is acknowledged
// without them: the slot fetches on, and each held lane, once finished,
// settles its key with one call that releases what arrived for the key
// meanwhile.

// laneFanOutAfter is how long one handler may run before the rest of its
// chunk is split into per-key lanes. Below it, a goroutine and a channel
// per key would cost more than the handlers; above it, the other keys of
// the chunk would wait for a slow one.
const laneFanOutAfter = 2 * time.Millisecond

// laneSlowMean: a chunk whose inline run has lasted laneFanOutAfter is
// split into lanes too when its handlers took this long on average. A
// thousand handlers of a few hundred microseconds each are no single slow
// key, but one after another they would take the slot far longer than
// side by side; handlers that only spend CPU stay well below it.
const laneSlowMean = 50 * time.Microsecond

// laneCheckMax is the longest wait between two looks for a slow handler
// in a chunk's inline run (see awaitInline).
const laneCheckMax = 8 * laneFanOutAfter

// laneHoldAfter is how long the last few lanes of a chunk may keep it open
// before the keys of those running a handler are held. Holding costs a few
// writes per held event; waiting costs the slot that long without fetching.
const laneHoldAfter = 50 * time.Millisecond

// laneFewDiv: lanes are "few" when at most 1/laneFewDiv of the chunk's
// lanes (at least one) are still running.
const laneFewDiv = 8

// lane is one key's events of one chunk.
type lane struct {
	key  KeyRef
	msgs []*Message
	// prev, when set, is a held lane of the same key that must finish
	// before this one starts: one handler per key at a time, even around a
	// release.
	prev *lane

	mu       sync.Mutex
	next     int       // index of the first message not finished
	results  []error   // per message, valid below next
	started  time.Time // when the running handler started
	running  bool      // a handler of the lane runs now
	finished bool      // no handler of the lane runs any more
	aborted  bool      // stopped because the work context ended
	// held: the key is (being) held from msgs[heldFrom] on; the lane then
	// waits for decided and, when holdOK, settles its key itself.
	held     bool
	heldFrom int
	holdOK   bool
	decided  chan struct{}
	// done is closed once a held lane settled (or gave up).
	done chan struct{}
}

// slotLanes is the lane state of one slot under one runner (lease).
type slotLanes struct {
	lease     *workerpool.Lease
	recovered bool
	sem       chan struct{} // running handlers of the slot

	// chunkMu is held by the runner from a receive until its chunk is
	// settled, and by a held lane while it settles its key: releasing a
	// key's deferred events while a chunk that deferred some of them is
	// still unacknowledged would deliver those twice after a crash.
	chunkMu sync.Mutex

	// ack is the last chunk, handled without failures or holds and not
	// acknowledged yet: the next receive acknowledges it in the same
	// statement, or drain does when the runner stops. Only the runner
	// goroutine uses it, and only while no lane of the slot is held (a
	// held key's settlement must not run before its chunk's ack).
	ack *dbq.Delivery

	mu      sync.Mutex
	held    map[KeyRef]*lane // detached lanes not finished yet
	queued  int              // unfinished events of detached lanes
	broken  error            // a held key could not be settled: give the slot up
	changed *wakeup.Signal
	wg      sync.WaitGroup
}

// lanesOf returns the lane state for lease, creating it for a new runner.
func (pc *PartitionedConsumer) lanesOf(lease *workerpool.Lease) *slotLanes {
	pc.lanesMu.Lock()
	defer pc.lanesMu.Unlock()
	sl := pc.lanes[lease.Slot]
	if sl == nil || sl.lease != lease {
		sl = &slotLanes{lease: lease, held: make(map[KeyRef]*lane), changed: wakeup.NewSignal(),
			sem: make(chan struct{}, pc.config.MaxWorkersPerSlot)}
		pc.lanes[lease.Slot] = sl
	}
	return sl
}

// drain sends the slot's pending acknowledgement and waits for its
// detached lanes (workerpool's Drain): they finish their handlers and
// settle their keys before the lease is released.
func (pc *PartitionedConsumer) drain(ctx context.Context, lease *workerpool.Lease) {
	pc.lanesMu.Lock()
	sl := pc.lanes[lease.Slot]
	if sl != nil && sl.lease == lease {
		delete(pc.lanes, lease.Slot)
	}
	pc.lanesMu.Unlock()
	if sl != nil && sl.lease == lease {
		pc.flushAck(ctx, sl, lease)
		sl.wg.Wait()
		pc.observeLanes(lease.Slot, nil)
	}
}

// takeAck returns the slot's pending acknowledgement for the receive
// about to be sent, and forgets it: if that statement fails, it rolled
// the acknowledgement back, and the chunk is received again.
func (sl *slotLanes) takeAck() *dbq.Delivery {
	ack := sl.ack
	sl.ack = nil
	return ack
}

// deferAck keeps a chunk's acknowledgement for the next receive when it
// can wait: nothing failed, nothing is held in this chunk, and no held
// lane of the slot could settle its key before the ack lands. It reports
// whether it did; otherwise the caller settles the chunk at once.
func (sl *slotLanes) deferAck(d dbq.Delivery, failures []failure, holding int) bool {
	if len(failures) > 0 || holding > 0 {
		return false
	}
	sl.mu.Lock()
	held := len(sl.held)
	sl.mu.Unlock()
	if held > 0 {
		return false
	}
	sl.ack = &d
	return true
}

// flushAck sends the slot's pending acknowledgement on its own when its
// runner stops, unless ctx (the slot's work context) ended: a fenced or
// hard-stopped slot settles nothing, and its chunk is received again.
func (pc *PartitionedConsumer) flushAck(ctx context.Context, sl *slotLanes, lease *workerpool.Lease) {
	ack := sl.takeAck()
	if ack == nil || ctx.Err() != nil {
		return
	}
	cfg := &pc.config
	start := time.Now()
	if _, err := pc.client.queries.AckDelivery(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, *ack); err != nil {
		err = mapError(fmt.Sprintf("acknowledging the last chunk of slot %d", lease.Slot), err)
		if errors.Is(err, ErrLeaseLost) {
			// Taken over, or settled by a receive whose answer was lost:
			// nothing to do.
			pc.client.logger.DebugContext(ctx, "pgque: last chunk of slot not acknowledged", slog.String("queue", cfg.Queue),
				slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot), slog.Any("error", err))
			return
		}
		pc.client.logger.WarnContext(ctx, "pgque: acknowledging chunk", slog.String("queue", cfg.Queue),
			slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot), slog.Any("error", err))
		pc.client.reportError(ctx, err)
		return
	}
	lease.Renewed(start)
}

// receive asks for the slot's next chunk, with its pending
// acknowledgement. When the call fails (a stop cancels it, a connection
// breaks) the acknowledgement did not land; it is sent once on its own,
// under the slot's work context, so that neither a graceful stop nor a
// passing error gives the chunk to the next owner again, and an
// acknowledgement that cannot land is not retried with every receive.
func (pc *PartitionedConsumer) receive(fetchCtx, workCtx context.Context, sl *slotLanes, lease *workerpool.Lease) ([]dbq.Row, error) {
	cfg := &pc.config
	ack := sl.takeAck()
	rows, err := pc.client.queries.ReceivePartitioned(fetchCtx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, cfg.BatchSize, ack)
	if err != nil && ack != nil {
		sl.ack = ack
		pc.flushAck(workCtx, sl, lease)
	}
	return rows, err
}

// recoverHolds releases the holds left on the slot — by an earlier owner,
// or by this process before it was fenced from the slot — once per runner,
// before the first receive: no lane of the slot runs then.
func (pc *PartitionedConsumer) recoverHolds(ctx context.Context, sl *slotLanes, lease *workerpool.Lease) error {
	if sl.recovered {
		return nil
	}
	cfg := &pc.config
	n, err := pc.client.queries.ReleaseStaleHoldsPartitioned(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token)
	if err != nil {
		return mapError(fmt.Sprintf("releasing earlier holds of slot %d", lease.Slot), err)
	}
	sl.recovered = true
	if n > 0 {
		pc.client.metrics.LaneRedelivered.WithLabelValues(cfg.Queue, cfg.Consumer).Add(float64(n))
		pc.client.logger.InfoContext(ctx, "pgque: released keys held before this worker started on the slot",
			slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot),
			slog.Int("events", n))
	}
	return nil
}

// workLanes processes one chunk of the slot with key lanes (a
// workerpool.WorkFunc).
func (pc *PartitionedConsumer) workLanes(fetchCtx, workCtx context.Context, lease *workerpool.Lease) (bool, error) {
	cfg := &pc.config
	sl := pc.lanesOf(lease)
	if err := pc.recoverHolds(fetchCtx, sl, lease); err != nil {
		return false, err
	}
	// Backpressure: the events detached lanes still hold in memory, plus
	// the next chunk, stay within MaxEventsPerSlot. Waiting for handlers
	// is not a stuck loop (workerpool's watchdog).
	waited := lease.Busy()
	defer waited()
	for {
		sl.mu.Lock()
		queued, broken := sl.queued, sl.broken
		sl.mu.Unlock()
		if broken != nil {
			return false, broken
		}
		if queued == 0 || queued+cfg.BatchSize <= cfg.MaxEventsPerSlot {
			break
		}
		select {
		case <-sl.changed.C():
		case <-fetchCtx.Done():
			return false, nil
		}
	}
	waited()

	sl.chunkMu.Lock()
	locked := true
	defer func() {
		if locked {
			sl.chunkMu.Unlock()
		}
	}()
	start := time.Now()
	rows, err := pc.receive(fetchCtx, workCtx, sl, lease)
	if err != nil {
		return false, mapError(fmt.Sprintf("receiving slot %d", lease.Slot), err)
	}
	lease.Renewed(start)
	if len(rows) == 0 {
		return false, nil
	}
	if rows[0].Epoch != lease.Epoch {
		return false, fmt.Errorf("receiving slot %d: server epoch %d, lease epoch %d: %w", lease.Slot, rows[0].Epoch, lease.Epoch, ErrLeaseLost)
	}
	msgs := toMessages(rows, cfg.Queue, cfg.Consumer, lease.Slot)
	for _, m := range msgs {
		m.NSlots = lease.NSlots
		m.token = lease.Token
	}
	// The chunk's nacks, ack and holds prove which chunk they settle.
	delivery := dbq.Delivery{Epoch: rows[0].Epoch, BatchID: rows[0].BatchID, MsgID: rows[0].MsgID}
	policy := pc.Policy()
	pause := policy == FailurePolicyPause

	handled := lease.Busy()
	defer handled()
	// The chunk starts on one goroutine; it is split into lanes only if
	// a handler turns out to be slow.
	in := pc.newInline(sl, msgs, pause)
	doneCh := make(chan *lane, len(msgs))
	go pc.runInline(workCtx, sl, lease, in, doneCh)
	lanes, pending, rest := pc.awaitInline(workCtx, sl, lease, in, doneCh)
	// A first split peels off only the slow key; the chunk's other keys
	// go on inline, and are split in turn only if one of them is slow.
	for rest != nil {
		var more []*lane
		var n int
		more, n, rest = pc.awaitInline(workCtx, sl, lease, rest, doneCh)
		lanes, pending = append(lanes, more...), pending+n
	}

	// Wait for the lanes; hold the last few if they take long.
	few := max(1, pending/laneFewDiv)
	var fewSince time.Time
	var timer *time.Timer
	var timerC <-chan time.Time
	stopTimer := func() {
		if timer != nil {
			timer.Stop()
		}
	}
	var holding []*lane
wait:
	for pending > 0 {
		if pending <= few {
			now := time.Now()
			if fewSince.IsZero() {
				fewSince = now
				timer = time.NewTimer(laneHoldAfter)
				timerC = timer.C
			}
			// When every lane left runs a handler that has run for
			// laneHoldAfter already, waiting for the grace only keeps the
			// slot from fetching: hold them now.
			if slowLanes(lanes, now) == pending {
				if holding = markHolds(lanes, now); len(holding) > 0 {
					break wait
				}
			}
		}
		select {
		case <-doneCh:
			pending--
		case now := <-timerC:
			holding = markHolds(lanes, now)
			if len(holding) > 0 {
				break wait
			}
			timer.Reset(laneHoldAfter / 5)
		}
	}
	stopTimer()
	// Lanes that finished while the holds were being marked report on
	// doneCh; every lane not held must be collected before settling.
	for pending > len(holding) {
		<-doneCh
		pending--
	}
	handled()
	if workCtx.Err() != nil || anyAborted(lanes) {
		defer lease.Busy()() // the held lanes run handlers
		abandonHolds(holding, doneCh)
		return false, errors.Join(errAborted, context.Cause(workCtx))
	}

	failures := chunkFailures(lanes)
	ackStart := time.Now()
	s := pc.chunkSettler(lease, policy, delivery)
	switch {
	case len(holding) > 0:
		// The holds must land with the ack: in the same transaction.
		err = pc.settleWithHolds(workCtx, &s, failures, lease, delivery, holding)
	case sl.deferAck(delivery, failures, 0):
		// Acknowledged by the next receive.
	default:
		err = s.settle(workCtx, pc.client.pool, failures)
	}
	if err != nil && len(holding) > 0 && workCtx.Err() == nil && !errors.Is(err, ErrLeaseLost) {
		// The holds did not land (the transaction rolled back): fall back
		// to the chunk barrier, so that a hold that keeps failing costs
		// throughput, never progress.
		pc.client.logger.WarnContext(workCtx, "pgque: holding slow keys failed; waiting for them instead",
			slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot),
			slog.Any("error", err))
		waitHeld := lease.Busy()
		unhold(holding, doneCh)
		waitHeld()
		holding = nil
		if workCtx.Err() != nil || anyAborted(lanes) {
			return false, errors.Join(errAborted, context.Cause(workCtx))
		}
		ackStart = time.Now()
		err = s.settle(workCtx, pc.client.pool, chunkFailures(lanes))
	}
	if err != nil {
		defer lease.Busy()() // the held lanes run handlers
		abandonHolds(holding, doneCh)
		return false, err
	}
	lease.Renewed(ackStart)
	sl.chunkMu.Unlock()
	locked = false
	if len(holding) > 0 {
		pc.detach(sl, holding)
	}
	pc.client.metrics.BatchDuration.WithLabelValues(cfg.Queue, cfg.Consumer).Observe(time.Since(start).Seconds())
	pc.observeLanes(lease.Slot, sl)
	return true, nil
}

// runLane runs one lane's handlers from msgs[from] on (from > 0: the
// earlier ones ran, or were abandoned, in the chunk's inline start), then
// reports on doneCh or, when its key was held, settles the key.
func (pc *PartitionedConsumer) runLane(ctx context.Context, sl *slotLanes, lease *workerpool.Lease, ln *lane, from int, pause bool, doneCh chan<- *lane) {
	if from == 0 && ln.prev != nil {
		select {
		case <-ln.prev.done:
		case <-ctx.Done():
		}
	}
	stop := false
	if from > 0 {
		ln.mu.Lock()
		// The head did not finish (the work context ended), or it failed
		// and its key's later events wait on the server.
		stop = ln.next < from || (pause && ln.results[from-1] != nil)
		ln.mu.Unlock()
	}
	for i := from; i < len(ln.msgs) && !stop; i++ {
		m := ln.msgs[i]
		if !pc.acquire(ctx, sl) {
			break
		}
		ln.mu.Lock()
		ln.started, ln.running = time.Now(), true
		ln.mu.Unlock()
		err := pc.invoker.call(ctx, m)
		pc.releaseWorker(sl)
		ln.mu.Lock()
		ln.running = false
		if ctx.Err() == nil {
			ln.results[i] = err
			ln.next = i + 1
		}
		ln.mu.Unlock()
		stop = ctx.Err() != nil || (err != nil && pause)
	}
	ln.mu.Lock()
	ln.finished = true
	ln.aborted = ctx.Err() != nil
	held := ln.held
	ln.mu.Unlock()
	if !held {
		doneCh <- ln
		return
	}
	<-ln.decided
	if !ln.holdOK {
		doneCh <- ln
		return
	}
	pc.settleHeld(ctx, sl, lease, ln)
}

// inlineRun is the start of a chunk: its events one after another in
// ev_id order on one goroutine, until a handler runs for laneFanOutAfter.
type inlineRun struct {
	msgs  []*Message
	pause bool
	// prevs are the held lanes of earlier chunks still running, by key:
	// a key's event waits for them (one handler per key at a time).
	prevs map[KeyRef]*lane

	mu      sync.Mutex
	next    int             // index after the last message finished
	results []error         // per message, valid below next
	failed  map[KeyRef]bool // under pause: keys failed in the chunk
	cur     int             // the running message's index
	started time.Time       // when it started
	begin   time.Time       // when the first message started
	running bool
	// handoff, once set, is the lane the running message heads: the
	// goroutine starts no further message of the chunk inline and goes
	// on with that lane.
	handoff *lane
	// suspect is when awaitInline first found the run slow, zero when it
	// did not at its last look.
	suspect time.Time
	aborted bool
	done    chan struct{} // closed when the inline run ends
	counted *atomic.Int32 // the count of inline runs this one is in
	// peeled: this run is what an earlier split of its chunk left inline
	// (every key but the one found slow, whose lane is peeledFrom). Its
	// own split, if one comes, gives every key a lane.
	peeled     bool
	peeledFrom *lane
}

// newInline prepares the inline run of a chunk.
func (pc *PartitionedConsumer) newInline(sl *slotLanes, msgs []*Message, pause bool) *inlineRun {
	in := &inlineRun{msgs: msgs, pause: pause, results: make([]error, len(msgs)), done: make(chan struct{})}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if len(sl.held) > 0 {
		for _, m := range msgs {
			k := m.Key()
			if p := sl.held[k]; p != nil {
				if in.prevs == nil {
					in.prevs = make(map[KeyRef]*lane)
				}
				in.prevs[k] = p
			}
		}
	}
	return in
}

// runInline runs the chunk's events in order on one running-handler place
// until awaitInline hands the running one over to a lane; the goroutine
// then goes on with that lane. Under pause, a failed key's later events
// are not handled: the nack defers them on the server.
func (pc *PartitionedConsumer) runInline(ctx context.Context, sl *slotLanes, lease *workerpool.Lease, in *inlineRun, doneCh chan<- *lane) {
	if !pc.acquire(ctx, sl) {
		in.end(true)
		return
	}
	pc.inlineRuns.Add(1)
	in.counted = &pc.inlineRuns
	for i, m := range in.msgs {
		k := m.Key()
		in.mu.Lock()
		skip := in.failed[k]
		in.mu.Unlock()
		if skip {
			continue
		}
		if p := in.prevs[k]; p != nil && !in.waitPrev(ctx, pc, sl, p) {
			in.end(true)
			return
		}
		in.mu.Lock()
		if ctx.Err() != nil || in.handoff != nil {
			in.mu.Unlock()
			break
		}
		in.cur, in.started, in.running = i, time.Now(), true
		if in.begin.IsZero() {
			in.begin = in.started
		}
		in.mu.Unlock()
		err := pc.invoker.call(ctx, m)
		in.mu.Lock()
		in.running = false
		ln := in.handoff
		if ln == nil && ctx.Err() == nil {
			in.results[i], in.next = err, i+1
			if err != nil && in.pause {
				if in.failed == nil {
					in.failed = make(map[KeyRef]bool)
				}
				in.failed[k] = true
			}
		}
		in.mu.Unlock()
		if ln != nil {
			pc.releaseWorker(sl)
			in.end(false)
			ln.mu.Lock()
			ln.running = false
			if ctx.Err() == nil {
				ln.results[0], ln.next = err, 1
			}
			ln.mu.Unlock()
			pc.runLane(ctx, sl, lease, ln, 1, in.pause, doneCh)
			return
		}
		if ctx.Err() != nil {
			break
		}
	}
	pc.releaseWorker(sl)
	in.end(ctx.Err() != nil)
}

// waitPrev waits for an earlier held lane of a key to exit, without the
// running-handler place the inline run holds (that lane may need one), and
// takes the place again. It reports false, holding no place, when ctx
// ended.
func (in *inlineRun) waitPrev(ctx context.Context, pc *PartitionedConsumer, sl *slotLanes, p *lane) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	pc.releaseWorker(sl)
	select {
	case <-p.done:
	case <-ctx.Done():
		return false
	}
	return pc.acquire(ctx, sl)
}

// end marks the inline run over and wakes awaitInline.
func (in *inlineRun) end(aborted bool) {
	if in.counted != nil {
		in.counted.Add(-1)
	}
	in.mu.Lock()
	in.aborted = aborted
	in.mu.Unlock()
	close(in.done)
}

// awaitInline waits for the inline run of a chunk (or of what is left of
// it). If it ends, its events are one finished lane. If a handler runs for
// laneFanOutAfter first, the run is split (see fanOut); it returns the
// lanes, how many of them report on doneCh, and the new inline run of the
// other keys when the split left one, which the caller awaits in turn.
func (pc *PartitionedConsumer) awaitInline(ctx context.Context, sl *slotLanes, lease *workerpool.Lease, in *inlineRun, doneCh chan<- *lane) ([]*lane, int, *inlineRun) {
	every := laneFanOutAfter
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-in.done:
			in.mu.Lock()
			defer in.mu.Unlock()
			return []*lane{{msgs: in.msgs, results: in.results, next: in.next, finished: true, aborted: in.aborted}}, 0, nil
		case <-timer.C:
			// Not the timer's value: when this goroutine waited for a
			// CPU, it is older than the handler's start.
			lanes, rest, wait := pc.fanOut(ctx, sl, lease, in, time.Now(), every, doneCh)
			if lanes != nil {
				return lanes, len(lanes) - 1, rest
			}
			// The handlers were fast: look less often. Every look wakes
			// a goroutine, which a busy machine pays for on every chunk
			// of every slot; a handler that turns slow between two looks
			// is caught at most laneCheckMax late.
			every = min(2*every, laneCheckMax)
			timer.Reset(wait)
		}
	}
}

// fanOut splits the inline run if its handler has run for laneFanOutAfter
// by now; otherwise it returns nil and how long to wait before looking
// again. The first lane returned is the run's finished part; the second is
// the running event's key, headed by that event, which the run's goroutine
// goes on with. A run's first split stops there: the events of the other
// keys become a new inline run, returned (and started) too. One slow key
// among fast ones then costs a goroutine, not one per key, and a fast
// handler that only looked slow (its process short of CPU) moves one key
// off the sequential path, not all of them. A run left by an earlier split
// gives every other key a lane of its own: a second slow key means the
// chunk's keys are slow, and they should overlap.
func (pc *PartitionedConsumer) fanOut(ctx context.Context, sl *slotLanes, lease *workerpool.Lease, in *inlineRun, now time.Time, every time.Duration, doneCh chan<- *lane) ([]*lane, *inlineRun, time.Duration) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.running {
		// Between two handlers, or waiting for a place: look again later,
		// to cut the chunk at a running handler.
		return nil, nil, every
	}
	// When more chunks run inline than there are CPUs, their handlers
	// take turns on them, and a handler's time includes waiting for its
	// turn: that is a busy process, not a slow key, and lanes would only
	// add work. The thresholds grow with the queue.
	after, mean := laneFanOutAfter, laneSlowMean
	if q := int(pc.inlineRuns.Load()) / max(pc.procs, 1); q > 1 {
		after, mean = after*time.Duration(q), mean*time.Duration(q)
	}
	ran := now.Sub(in.started)
	// A run left by a peel whose peeled key is still in a handler that has
	// run for as long: two keys slow at once are slow keys, not a busy
	// process. Its handler is then held to the unscaled threshold, and
	// split without a grace.
	corroborated := in.peeledFrom != nil && in.peeledFrom.runningFor(now) >= after
	slow := ran >= after || (corroborated && ran >= laneFanOutAfter)
	if el := now.Sub(in.begin); !slow && el >= after && in.cur > 0 {
		slow = el >= time.Duration(in.cur)*mean
	}
	if !slow {
		in.suspect = time.Time{}
		if ran >= after/2 {
			// This one may be turning slow: look when it would be.
			return nil, nil, after - ran
		}
		return nil, nil, every
	}
	// A process short of CPU makes a fast handler look slow: it waits
	// for its turn while the clock runs. Split only if it still looks
	// slow a grace later, when this goroutine has had a turn too; a fast
	// handler has returned by then.
	switch {
	case corroborated:
	case in.suspect.IsZero():
		in.suspect = now
		return nil, nil, after
	case now.Sub(in.suspect) < after:
		return nil, nil, after - now.Sub(in.suspect)
	}
	cur := in.cur
	// Events below cur are finished, or not handled because their key
	// failed under pause: the chunk's ack settles them.
	lanes := []*lane{{msgs: in.msgs[:cur], results: in.results[:cur], next: cur, finished: true}}
	if !in.peeled {
		return pc.peel(ctx, sl, lease, in, lanes, doneCh)
	}
	byKey := make(map[KeyRef]*lane)
	for _, m := range in.msgs[cur:] {
		k := m.Key()
		if in.failed[k] {
			continue
		}
		ln := byKey[k]
		if ln == nil {
			ln = &lane{key: k, decided: make(chan struct{}), done: make(chan struct{})}
			if len(lanes) > 1 {
				// The head's key waited for its earlier lane already.
				ln.prev = in.prevs[k]
			}
			byKey[k] = ln
			lanes = append(lanes, ln)
		}
		ln.msgs = append(ln.msgs, m)
	}
	for _, ln := range lanes[1:] {
		ln.results = make([]error, len(ln.msgs))
	}
	head := lanes[1]
	head.running, head.started = true, in.started
	in.handoff = head
	for _, ln := range lanes[2:] {
		go pc.runLane(ctx, sl, lease, ln, 0, in.pause, doneCh)
	}
	return lanes, nil, 0
}

// peel is a run's first split (see fanOut), with in.mu held: the running
// key's events from the running one on become its lane, which the run's
// goroutine goes on with, and the other keys' events a new inline run,
// started here. lanes holds the run's finished part.
func (pc *PartitionedConsumer) peel(ctx context.Context, sl *slotLanes, lease *workerpool.Lease, in *inlineRun, lanes []*lane, doneCh chan<- *lane) ([]*lane, *inlineRun, time.Duration) {
	k := in.msgs[in.cur].Key()
	// The head's key waited for its earlier lane already (no prev).
	head := &lane{key: k, decided: make(chan struct{}), done: make(chan struct{})}
	var others []*Message
	for _, m := range in.msgs[in.cur:] {
		switch mk := m.Key(); {
		case in.failed[mk]:
			// Not handled under pause: the chunk's nack defers it.
		case mk == k:
			head.msgs = append(head.msgs, m)
		default:
			others = append(others, m)
		}
	}
	head.results = make([]error, len(head.msgs))
	head.running, head.started = true, in.started
	in.handoff = head
	lanes = append(lanes, head)
	if len(others) == 0 {
		return lanes, nil, 0
	}
	// Earlier chunks' held lanes still bind the other keys: the new run
	// waits for them as this one would have.
	rest := &inlineRun{msgs: others, pause: in.pause, prevs: in.prevs, peeled: true, peeledFrom: head,
		results: make([]error, len(others)), done: make(chan struct{})}
	go pc.runInline(ctx, sl, lease, rest, doneCh)
	return lanes, rest, 0
}

// acquire takes a running-handler place in the slot and in the process.
func (pc *PartitionedConsumer) acquire(ctx context.Context, sl *slotLanes) bool {
	select {
	case sl.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	select {
	case pc.workers <- struct{}{}:
	case <-ctx.Done():
		<-sl.sem
		return false
	}
	pc.addRunning(1)
	return true
}

func (pc *PartitionedConsumer) releaseWorker(sl *slotLanes) {
	pc.addRunning(-1)
	<-pc.workers
	<-sl.sem
}

// addRunning changes the count of running handlers and its gauge.
func (pc *PartitionedConsumer) addRunning(d int) {
	pc.runningMu.Lock()
	pc.running += d
	pc.runningGauge.Set(float64(pc.running))
	pc.runningMu.Unlock()
}

// markHolds marks as held, from their first unfinished event, the lanes
// whose running handler has run for laneHoldAfter by now, and returns them.
// A lane waiting for a place in a semaphore, or for its turn on the CPU
// between fast handlers, is not a slow key: holding it would only cost
// writes.
func markHolds(lanes []*lane, now time.Time) []*lane {
	var out []*lane
	for _, ln := range lanes {
		ln.mu.Lock()
		if ln.slowAt(now) {
			ln.held, ln.heldFrom = true, ln.next
			out = append(out, ln)
		}
		ln.mu.Unlock()
	}
	return out
}

// slowAt reports whether the lane's running handler has run for
// laneHoldAfter by now (ln.mu held).
// runningFor is how long the lane's running handler has run by now, 0
// when none runs.
func (ln *lane) runningFor(now time.Time) time.Duration {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if !ln.running || ln.finished {
		return 0
	}
	return now.Sub(ln.started)
}

func (ln *lane) slowAt(now time.Time) bool {
	return !ln.finished && ln.running && ln.next < len(ln.msgs) && now.Sub(ln.started) >= laneHoldAfter
}

// slowLanes counts the lanes that markHolds would hold at now.
func slowLanes(lanes []*lane, now time.Time) int {
	n := 0
	for _, ln := range lanes {
		ln.mu.Lock()
		if ln.slowAt(now) {
			n++
		}
		ln.mu.Unlock()
	}
	return n
}

// abandonHolds tells held lanes that their hold did not land, and waits for
// them: the chunk is not acknowledged, so their events come again.
func abandonHolds(holding []*lane, doneCh <-chan *lane) {
	for _, ln := range holding {
		ln.holdOK = false
		close(ln.decided)
	}
	for range holding {
		<-doneCh
	}
	for _, ln := range holding {
		close(ln.done)
	}
}

// unhold turns held lanes back into ordinary ones of the chunk and waits
// for them to finish.
func unhold(holding []*lane, doneCh <-chan *lane) {
	for _, ln := range holding {
		ln.mu.Lock()
		ln.held = false
		ln.mu.Unlock()
		ln.holdOK = false
		close(ln.decided)
	}
	for range holding {
		<-doneCh
	}
	for _, ln := range holding {
		close(ln.done)
	}
}

func anyAborted(lanes []*lane) bool {
	for _, ln := range lanes {
		ln.mu.Lock()
		a := ln.aborted && !ln.held
		ln.mu.Unlock()
		if a {
			return true
		}
	}
	return false
}

// chunkFailures collects the failures the chunk's ack settles: all of the
// lanes not held, and those before the hold of the held ones.
func chunkFailures(lanes []*lane) []failure {
	var out []failure
	for _, ln := range lanes {
		ln.mu.Lock()
		upto := ln.next
		if ln.held {
			upto = ln.heldFrom
		}
		for i := range upto {
			if ln.results[i] != nil {
				out = append(out, failure{msg: ln.msgs[i], err: ln.results[i]})
			}
		}
		ln.mu.Unlock()
	}
	return out
}

// settleWithHolds holds the keys of holding and settles the chunk, in one
// transaction.
func (pc *PartitionedConsumer) settleWithHolds(ctx context.Context, s *settler, failures []failure, lease *workerpool.Lease, delivery dbq.Delivery, holding []*lane) error {
	cfg := &pc.config
	tx, err := pc.client.pool.Begin(ctx)
	if err != nil {
		return mapError("settling chunk", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	q := dbq.New(tx)
	for _, ln := range holding {
		ln.mu.Lock()
		head := ln.msgs[ln.heldFrom].ID
		ln.mu.Unlock()
		if _, err := q.HoldKeyPartitioned(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, delivery, ln.key.arg(), head); err != nil {
			return mapError(fmt.Sprintf("holding key %v of slot %d", ln.key, lease.Slot), err)
		}
	}
	if err := s.settle(ctx, tx, failures); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return mapError("settling chunk", err)
	}
	pc.client.metrics.KeyHolds.WithLabelValues(cfg.Queue, cfg.Consumer).Add(float64(len(holding)))
	return nil
}

// detach hands held lanes over to the slot's lane state: the slot fetches
// on while they finish.
func (pc *PartitionedConsumer) detach(sl *slotLanes, holding []*lane) {
	sl.mu.Lock()
	for _, ln := range holding {
		ln.mu.Lock()
		ln.holdOK = true
		n := len(ln.msgs) - ln.heldFrom
		ln.mu.Unlock()
		sl.held[ln.key] = ln
		sl.queued += n
		sl.wg.Add(1)
	}
	sl.mu.Unlock()
	for _, ln := range holding {
		close(ln.decided)
	}
}

// settleHeld settles a held lane's key once its handlers are done: the
// events it handled are dropped from the hold, failures retried or
// dead-lettered, the rest released. It retries transient errors; if the
// key cannot be settled, the slot is given up so that its next owner
// releases the hold.
func (pc *PartitionedConsumer) settleHeld(ctx context.Context, sl *slotLanes, lease *workerpool.Lease, ln *lane) {
	cfg := &pc.config
	defer func() {
		sl.mu.Lock()
		if sl.held[ln.key] == ln {
			delete(sl.held, ln.key)
		}
		sl.queued -= len(ln.msgs) - ln.heldFrom
		sl.mu.Unlock()
		close(ln.done)
		sl.changed.Fire()
		pc.observeLanes(lease.Slot, sl)
		sl.wg.Done()
	}()
	if ln.aborted || ctx.Err() != nil {
		return // the next owner releases the hold
	}
	head := ln.msgs[ln.heldFrom].ID
	var done []int64
	var failed []dbq.HeldFailure
	// The delays are those the chunk's settler gives: DeadLetter and
	// RetryAfter errors are honoured in held lanes too.
	delays := settler{retryDelay: cfg.RetryDelay}
	for i := ln.heldFrom; i < ln.next; i++ {
		m := ln.msgs[i]
		if err := ln.results[i]; err != nil {
			failed = append(failed, dbq.HeldFailure{ID: m.ID, RetryAfter: delays.delay(failure{msg: m, err: err}), Reason: reason(err)})
		} else {
			done = append(done, m.ID)
		}
	}
	for attempt := 0; ; attempt++ {
		sl.chunkMu.Lock()
		start := time.Now()
		ok, err := pc.client.queries.SettleHeldPartitioned(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token,
			lease.Epoch, ln.key.arg(), head, done, failed)
		sl.chunkMu.Unlock()
		if err == nil {
			lease.Renewed(start)
			if !ok {
				pc.client.logger.WarnContext(ctx, "pgque: hold of key was released by another owner; its events are handled again",
					slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot))
				return
			}
			if len(failed) > 0 {
				// The server settled the failures under its policy of the
				// moment; an operator may have switched it while the lane
				// ran, and Policy() must say what the next chunk gets.
				if now, perr := serverPolicy(ctx, pc.client.queries, cfg.Queue, cfg.Consumer); perr == nil {
					pc.policy.Store(int32(now))
				}
			}
			break
		}
		err = mapError(fmt.Sprintf("settling held key %v of slot %d", ln.key, lease.Slot), err)
		if errors.Is(err, ErrLeaseLost) || ctx.Err() != nil || attempt >= 4 {
			sl.mu.Lock()
			if sl.broken == nil {
				sl.broken = fmt.Errorf("%w; giving the slot up so that its next owner releases the key: %w", err, ErrLeaseLost)
			}
			sl.mu.Unlock()
			return
		}
		pc.client.logger.WarnContext(ctx, "pgque: settling held key", slog.Any("error", err))
		if !backoff.Sleep(ctx.Done(), backoff.Errors.Delay(attempt)) {
			return
		}
	}
}

// chunkSettler is the settler of the chunk delivery of the slot held by
// lease: its nacks and ack prove which chunk they settle.
func (pc *PartitionedConsumer) chunkSettler(lease *workerpool.Lease, policy FailurePolicy, delivery dbq.Delivery) settler {
	cfg := &pc.config
	return settler{
		retryDelay: cfg.RetryDelay, metrics: pc.client.metrics, queue: cfg.Queue, consumer: cfg.Consumer,
		nack: func(ctx context.Context, q *dbq.Queries, m *Message, after time.Duration, reason string) (bool, error) {
			return q.NackDelivery(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, delivery, m.ID, after, reason)
		},
		ack: func(ctx context.Context, q *dbq.Queries) (bool, error) {
			return q.AckDelivery(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, delivery)
		},
		// The chunk was handled under policy: its nacks and ack are right
		// only if the server still applies that policy (an operator may have
		// switched it). Otherwise nothing is settled, and the chunk is
		// received again and handled under the new policy.
		check: func(ctx context.Context, q *dbq.Queries) error {
			now, err := serverPolicy(ctx, q, cfg.Queue, cfg.Consumer)
			if err != nil {
				return err
			}
			if now != policy {
				pc.policy.CompareAndSwap(int32(policy), int32(now))
				return fmt.Errorf("chunk of slot %d was handled under failure policy %s, the consumer's policy is now %s; it is handled again: %w",
					lease.Slot, policy, now, ErrPolicyMismatch)
			}
			return nil
		},
	}
}

// LaneStats is a snapshot of one owned slot's key lanes in this process.
type LaneStats struct {
	Slot int
	// HeldKeys are keys whose lanes run on after their chunk was
	// acknowledged (held on the server).
	HeldKeys int
	// Queued is how many events those lanes still hold in memory.
	Queued int
	// OldestInFlight is when the oldest event still being handled by a
	// held lane was created (zero when none).
	OldestInFlight time.Time
}

// LaneStats returns the lane state of each slot this process owns.
func (pc *PartitionedConsumer) LaneStats() []LaneStats {
	pc.lanesMu.Lock()
	slots := make(map[int]*slotLanes, len(pc.lanes))
	for s, sl := range pc.lanes {
		slots[s] = sl
	}
	pc.lanesMu.Unlock()
	out := make([]LaneStats, 0, len(slots))
	for s, sl := range slots {
		out = append(out, sl.stats(s))
	}
	return out
}

func (sl *slotLanes) stats(slot int) LaneStats {
	st := LaneStats{Slot: slot}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	st.HeldKeys, st.Queued = len(sl.held), sl.queued
	for _, ln := range sl.held {
		ln.mu.Lock()
		if ln.next < len(ln.msgs) {
			if t := ln.msgs[ln.next].CreatedAt; st.OldestInFlight.IsZero() || t.Before(st.OldestInFlight) {
				st.OldestInFlight = t
			}
		}
		ln.mu.Unlock()
	}
	return st
}

// observeLanes updates the per-slot lane gauges (nil: the slot is gone).
func (pc *PartitionedConsumer) observeLanes(slot int, sl *slotLanes) {
	m, cfg := pc.client.metrics, &pc.config
	lbl := []string{cfg.Queue, cfg.Consumer, fmt.Sprint(slot)}
	if sl == nil {
		// The slot is no longer worked here: nothing of it is held.
		m.LaneQueued.WithLabelValues(lbl...).Set(0)
		m.LaneOldestAge.WithLabelValues(lbl...).Set(0)
		return
	}
	st := sl.stats(slot)
	m.LaneQueued.WithLabelValues(lbl...).Set(float64(st.Queued))
	age := 0.0
	if !st.OldestInFlight.IsZero() {
		age = time.Since(st.OldestInFlight).Seconds()
	}
	m.LaneOldestAge.WithLabelValues(lbl...).Set(age)
}
