// Package lanes is the key-lane scheduler of a partitioned consumer's slot
// (see docs/worker-pool.md): it runs a chunk's handlers, inline while they
// are fast and in per-key lanes once one is slow, and holds the keys of the
// last few slow lanes so that the slot can fetch on without them.
//
// A slot's chunk first runs on one goroutine, event after event in ev_id
// order, as a slot without lanes does: while handlers are fast that is the
// cheapest way through a chunk. Once a handler has run for FanOutAfter, its
// key is peeled off into a lane: the running event's key goes on in the
// goroutine that runs it, and the chunk's other keys go on inline on a new
// goroutine. If one of those turns slow as well, the rest is split by
// partition key: every key gets a goroutine that runs its events one at a
// time in ev_id order, and the lanes run concurrently, bounded by a
// per-slot and a per-process semaphore. When all lanes of a chunk are done
// the chunk is settled as before. When only a few lanes have been left
// running for the hold time (HoldAfter unless the pool has its own), the
// keys of those whose handler has run that long are held on the server
// (their unfinished events deferred, later ones deferred on receipt), as
// are those with events left for ten times the hold time at their
// handlers' mean, and after ten times the hold time the keys of those
// running any handler (a hot key's many fast events); the chunk is
// acknowledged without them: the slot fetches
// on, and each held lane, once finished, settles its key with one call that
// releases what arrived for the key meanwhile.
//
// A slot that is being given up (its process stops, or the slot goes to
// another worker: the channel given to NewSlot closes) hands back what it
// has not started: lanes
// and inline runs start no further event, every key not through its events
// is held from the event it runs or the first it has not started, and each
// settle releases the rest, in order, for the next owner. A stop then waits
// for one handler per running key, not for the chunk.
//
// The package knows nothing of the database: the consumer runs handlers
// and settles held keys (Host), and settles each chunk with what Chunk
// reports (its failures and holds). Per key, events run in the order given
// and one at a time, also across chunks while a key is held.
package lanes

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/wakeup"
)

// FanOutAfter is how long one handler may run before the rest of its chunk
// is split into per-key lanes. Below it, a goroutine and a channel per key
// would cost more than the handlers; above it, the other keys of the chunk
// would wait for a slow one.
const FanOutAfter = 2 * time.Millisecond

// slowMean: a chunk whose inline run has lasted FanOutAfter is split into
// lanes too when its handlers took this long on average. A thousand
// handlers of a few hundred microseconds each are no single slow key, but
// one after another they would take the slot far longer than side by side;
// handlers that only spend CPU stay well below it.
const slowMean = 50 * time.Microsecond

// checkMax is the longest wait between two looks for a slow handler in a
// chunk's inline run (see awaitInline).
const checkMax = 8 * FanOutAfter

// HoldAfter is the default of how long the last few lanes of a chunk may
// keep it open before the keys of those running a handler are held
// (NewPool's holdAfter). Holding costs a few
// writes per held event; waiting costs the slot that long without fetching.
const HoldAfter = 50 * time.Millisecond

// busyHoldFactor: once the last few lanes of a chunk have kept it open for
// busyHoldFactor × the hold time, those running a handler are held however
// fast each handler is. A hot key's share of a chunk (hundreds of 5–20 ms
// events once it falls behind) would otherwise keep the slot's other keys
// waiting for as long; holding it at the hold time itself sent its events
// through the server and back at every chunk, which cost the hot key more
// than its neighbours gained (docs/design.md, "Key lanes and holds").
const busyHoldFactor = 10

// fewDiv: lanes are "few" when at most 1/fewDiv of the chunk's lanes (at
// least one) are still running.
const fewDiv = 8

// Event is what the scheduler needs of an event: its partition key.
type Event[K comparable] interface {
	Key() K
}

// Host is what the scheduler needs of its consumer: run one event's
// handler, and settle a held key once its lane is done.
type Host[M Event[K], K comparable] interface {
	// Run runs the handler of m. Its error is the event's result; a
	// result is kept only while ctx has not ended.
	Run(ctx context.Context, m M) error
	// SettleHeld settles a held key after its lane finished: the events
	// handled since the hold with their results, the rest released. A key
	// handed back before its lane ran anything since the hold is not
	// settled: the slot's next owner releases it. It
	// runs on the lane's goroutine; around each statement that settles,
	// it takes the slot's chunk lock (Slot.LockChunk). A non-nil error
	// means the key could not be settled: the slot is broken (Slot.WaitRoom
	// returns the error) and must be given up, so that its next owner
	// releases the hold.
	SettleHeld(ctx context.Context, h Held[M, K]) error
}

// Held is a held key's lane after its last handler: Head is the first event
// of the hold, Handled the events handled since (Head first), Results their
// results (nil: handled).
type Held[M any, K comparable] struct {
	Key     K
	Head    M
	Handled []M
	Results []error
}

// Failure is an event of a chunk whose handler failed.
type Failure[M any] struct {
	Msg M
	Err error
}

// Hold is a key the chunk's settlement must hold, from Head on.
type Hold[M any, K comparable] struct {
	Key  K
	Head M
}

// Pool bounds the handlers running in lanes across a process's slots.
type Pool struct {
	workers chan struct{}
	// mu keeps onRunning's calls in the order of the count's changes.
	mu        sync.Mutex
	running   int
	onRunning func(n int)
	// inline counts the chunks running inline; procs is GOMAXPROCS: more
	// inline runs than procs wait for a CPU in turn.
	inline atomic.Int32
	procs  int
	// cpuShort says whether the process's goroutines wait for a CPU now
	// (a schedProbe's; tests set their own).
	cpuShort func(now time.Time) bool
	// holdAfter: HoldAfter, or the consumer's own.
	holdAfter time.Duration
}

// NewPool returns a Pool of maxWorkers running handlers for a process of
// procs CPUs; onRunning, when set, is told the count of running handlers
// whenever it changes.
func NewPool(maxWorkers, procs int, holdAfter time.Duration, onRunning func(n int)) *Pool {
	if holdAfter <= 0 {
		holdAfter = HoldAfter
	}
	return &Pool{workers: make(chan struct{}, maxWorkers), procs: procs, holdAfter: holdAfter, onRunning: onRunning,
		cpuShort: newSchedProbe().cpuShort}
}

// addRunning changes the count of running handlers.
func (p *Pool) addRunning(d int) {
	p.mu.Lock()
	p.running += d
	if p.onRunning != nil {
		p.onRunning(p.running)
	}
	p.mu.Unlock()
}

// lane is one key's events of one chunk.
type lane[M Event[K], K comparable] struct {
	key  K
	msgs []M
	// prev, when set, is a held lane of the same key that must finish
	// before this one starts: one handler per key at a time, even around a
	// release.
	prev *lane[M, K]

	mu      sync.Mutex
	next    int       // index of the first message not finished
	results []error   // per message, valid below next
	started time.Time // when the running handler started
	running bool      // a handler of the lane runs now
	// ranFor is the time the lane's own handlers took, runs how many ran:
	// their mean tells how long its events still to run will take.
	ranFor   time.Duration
	runs     int
	finished bool // no handler of the lane runs any more
	aborted  bool // stopped because the work context ended
	cut      bool // stopped before its last event: handed back
	// held: the key is (being) held from msgs[heldFrom] on; the lane then
	// waits for decided and, when holdOK, settles its key itself.
	held     bool
	heldFrom int
	holdOK   bool
	decided  chan struct{}
	// done is closed once a held lane settled (or gave up).
	done chan struct{}
}

func newLane[M Event[K], K comparable](key K) *lane[M, K] {
	return &lane[M, K]{key: key, decided: make(chan struct{}), done: make(chan struct{})}
}

// Slot is the lane state of one slot under one owner (lease).
type Slot[M Event[K], K comparable] struct {
	pool      *Pool
	host      Host[M, K]
	onChanged func()
	sem       chan struct{} // running handlers of the slot

	// chunkMu is held by the owner from a receive until its chunk is
	// settled, and by a held lane while it settles its key: releasing a
	// key's deferred events while a chunk that deferred some of them is
	// still unacknowledged would deliver those twice after a crash.
	chunkMu sync.Mutex

	mu      sync.Mutex
	held    map[K]*lane[M, K] // detached lanes not finished yet
	queued  int               // unfinished events of detached lanes
	broken  error             // a held key could not be settled: give the slot up
	changed *wakeup.Signal
	wg      sync.WaitGroup

	// back closes when the slot is being given up (NewSlot).
	back <-chan struct{}
}

// NewSlot returns the lane state of a slot whose handlers run on host, at
// most maxWorkers at a time, within pool's bound. onChanged, when set, is
// called whenever a held lane is gone. back, when it closes, says that the
// slot is being given up: its lanes start no further event, and what they
// have not started goes back to the server through holds (see the package
// comment); the chunk running returns from Run with those keys to hold,
// and held lanes of earlier chunks settle once their running handler is
// done. A nil back never closes.
func NewSlot[M Event[K], K comparable](pool *Pool, host Host[M, K], maxWorkers int, onChanged func(), back <-chan struct{}) *Slot[M, K] {
	return &Slot[M, K]{pool: pool, host: host, onChanged: onChanged, sem: make(chan struct{}, maxWorkers),
		held: make(map[K]*lane[M, K]), changed: wakeup.NewSignal(), back: back}
}

// handedBack reports whether the slot is being given up.
func (s *Slot[M, K]) handedBack() bool {
	select {
	case <-s.back:
		return true
	default:
		return false
	}
}

// LockChunk takes the slot's chunk lock: the owner holds it from a receive
// until the chunk is settled, Host.SettleHeld around each settling
// statement.
func (s *Slot[M, K]) LockChunk() { s.chunkMu.Lock() }

// UnlockChunk releases the chunk lock.
func (s *Slot[M, K]) UnlockChunk() { s.chunkMu.Unlock() }

// Holding returns how many held keys of the slot have not settled yet.
func (s *Slot[M, K]) Holding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// WaitRoom waits until the events held lanes still keep in memory plus a
// chunk of batch events stay within limit (backpressure). It returns false
// when ctx ended first, and the error of a held key that could not be
// settled: the slot is then to be given up.
func (s *Slot[M, K]) WaitRoom(ctx context.Context, batch, limit int) (bool, error) {
	for {
		s.mu.Lock()
		queued, broken := s.queued, s.broken
		s.mu.Unlock()
		if broken != nil {
			return false, broken
		}
		if queued == 0 || queued+batch <= limit {
			return true, nil
		}
		select {
		case <-s.changed.C():
		case <-ctx.Done():
			return false, nil
		}
	}
}

// Wait waits for the slot's held lanes to finish and settle their keys.
func (s *Slot[M, K]) Wait() { s.wg.Wait() }

// Stats is a snapshot of a slot's held lanes.
type Stats struct {
	// HeldKeys is how many keys are held.
	HeldKeys int
	// Queued is how many events their lanes still keep in memory.
	Queued int
	// Oldest is created of the oldest event a held lane has not finished
	// (zero when none).
	Oldest time.Time
}

// Stats returns the slot's held lanes; created tells when an event was
// created.
func (s *Slot[M, K]) Stats(created func(M) time.Time) Stats {
	var st Stats
	s.mu.Lock()
	defer s.mu.Unlock()
	st.HeldKeys, st.Queued = len(s.held), s.queued
	for _, ln := range s.held {
		ln.mu.Lock()
		if ln.next < len(ln.msgs) {
			if t := created(ln.msgs[ln.next]); st.Oldest.IsZero() || t.Before(st.Oldest) {
				st.Oldest = t
			}
		}
		ln.mu.Unlock()
	}
	return st
}

// Chunk is a chunk after Slot.Run: its lanes are finished but for the held
// ones, which wait for the owner to settle the chunk and then Detach,
// Unhold or Abandon.
type Chunk[M Event[K], K comparable] struct {
	slot    *Slot[M, K]
	lanes   []*lane[M, K]
	holding []*lane[M, K]
	doneCh  chan *lane[M, K]
	pause   bool
}

// Run runs a chunk's handlers under ctx (the slot's work context) and
// returns when every lane is finished or held. Under pause, a failed key's
// later events of the chunk are not handled. The caller holds the chunk
// lock.
func (s *Slot[M, K]) Run(ctx context.Context, msgs []M, pause bool) *Chunk[M, K] {
	// The chunk starts on one goroutine; it is split into lanes only if
	// a handler turns out to be slow.
	in := s.newInline(msgs, pause)
	c := &Chunk[M, K]{slot: s, doneCh: make(chan *lane[M, K], len(msgs)), pause: pause}
	go s.runInline(ctx, in, c.doneCh)
	lanes, pending, rest := s.awaitInline(ctx, in, c.doneCh)
	// A first split peels off only the slow key; the chunk's other keys
	// go on inline, and are split in turn only if one of them is slow.
	for rest != nil {
		var more []*lane[M, K]
		var n int
		more, n, rest = s.awaitInline(ctx, rest, c.doneCh)
		lanes, pending = append(lanes, more...), pending+n
	}
	c.lanes = lanes
	c.holding = c.wait(pending)
	return c
}

// wait waits for the pending lanes of the chunk, holding the last few if
// they take long, and returns the held ones.
func (c *Chunk[M, K]) wait(pending int) []*lane[M, K] {
	few := max(1, pending/fewDiv)
	holdAfter := c.slot.pool.holdAfter
	var fewSince time.Time
	var timer *time.Timer
	var timerC <-chan time.Time
	var holding []*lane[M, K]
wait:
	for pending > 0 {
		if pending <= few {
			now := time.Now()
			if fewSince.IsZero() {
				fewSince = now
				timer = time.NewTimer(holdAfter)
				timerC = timer.C
			}
			// When every lane left runs a handler that has run for
			// HoldAfter already, or has events left for ten times that,
			// waiting for the grace only keeps the slot from fetching:
			// hold them now.
			if slowLanes(c.lanes, now, holdAfter) == pending {
				if holding = markHolds(c.lanes, now, holdAfter); len(holding) > 0 {
					break wait
				}
			}
		}
		select {
		case <-c.doneCh:
			pending--
		case now := <-timerC:
			holding = markHolds(c.lanes, now, holdAfter)
			if len(holding) == 0 && now.Sub(fewSince) >= busyHoldFactor*holdAfter {
				// No handler is slow, but a few keys' many events have
				// kept the chunk open for long: hold those running.
				holding = markHolds(c.lanes, now, 0)
			}
			if len(holding) > 0 {
				break wait
			}
			timer.Reset(holdAfter / 5)
		case <-c.slot.back:
			holding = markBack(c.lanes, c.pause)
			break wait
		}
	}
	if timer != nil {
		timer.Stop()
	}
	// Lanes that finished while the holds were being marked report on
	// doneCh; every lane not held must be collected before settling.
	for pending > len(holding) {
		<-c.doneCh
		pending--
	}
	return holding
}

// Aborted reports whether a lane not held stopped because the work context
// ended, or was handed back with its hold undone (Unhold): the chunk is not
// to be settled, and comes again.
func (c *Chunk[M, K]) Aborted() bool {
	for _, ln := range c.lanes {
		ln.mu.Lock()
		a := (ln.aborted || ln.cut) && !ln.held
		ln.mu.Unlock()
		if a {
			return true
		}
	}
	return false
}

// Failures returns the failures the chunk's ack settles: all of the lanes
// not held, and those before the hold of the held ones.
func (c *Chunk[M, K]) Failures() []Failure[M] {
	var out []Failure[M]
	for _, ln := range c.lanes {
		ln.mu.Lock()
		upto := ln.next
		if ln.held {
			upto = ln.heldFrom
		}
		for i := range upto {
			if ln.results[i] != nil {
				out = append(out, Failure[M]{Msg: ln.msgs[i], Err: ln.results[i]})
			}
		}
		ln.mu.Unlock()
	}
	return out
}

// Holds returns the keys the chunk's settlement must hold, in the same
// transaction as its ack.
func (c *Chunk[M, K]) Holds() []Hold[M, K] {
	out := make([]Hold[M, K], 0, len(c.holding))
	for _, ln := range c.holding {
		ln.mu.Lock()
		out = append(out, Hold[M, K]{Key: ln.key, Head: ln.msgs[ln.heldFrom]})
		ln.mu.Unlock()
	}
	return out
}

// Abandon tells the held lanes that their hold did not land, and waits for
// them: the chunk is not acknowledged, so their events come again.
func (c *Chunk[M, K]) Abandon() {
	for _, ln := range c.holding {
		ln.holdOK = false
		close(ln.decided)
	}
	c.collectHolding()
}

// Unhold turns the held lanes back into ordinary ones of the chunk and
// waits for them to finish: the chunk is then settled without holds.
func (c *Chunk[M, K]) Unhold() {
	for _, ln := range c.holding {
		ln.mu.Lock()
		ln.held = false
		ln.mu.Unlock()
		ln.holdOK = false
		close(ln.decided)
	}
	c.collectHolding()
}

// collectHolding waits for the held lanes, told that they are not held,
// to finish.
func (c *Chunk[M, K]) collectHolding() {
	for range c.holding {
		<-c.doneCh
	}
	for _, ln := range c.holding {
		close(ln.done)
	}
	c.holding = nil
}

// Detach hands the held lanes over to the slot once their holds landed
// with the chunk's ack: the slot fetches on while they finish, and each
// settles its key (Host.SettleHeld).
func (c *Chunk[M, K]) Detach() {
	if len(c.holding) == 0 {
		return
	}
	s := c.slot
	s.mu.Lock()
	for _, ln := range c.holding {
		ln.mu.Lock()
		ln.holdOK = true
		n := len(ln.msgs) - ln.heldFrom
		ln.mu.Unlock()
		s.held[ln.key] = ln
		s.queued += n
		s.wg.Add(1)
	}
	s.mu.Unlock()
	for _, ln := range c.holding {
		close(ln.decided)
	}
	c.holding = nil
}

// settleHeld settles a held lane's key once its handlers are done; if the
// key cannot be settled, the slot is broken.
func (s *Slot[M, K]) settleHeld(ctx context.Context, ln *lane[M, K]) {
	defer func() {
		s.mu.Lock()
		if s.held[ln.key] == ln {
			delete(s.held, ln.key)
		}
		s.queued -= len(ln.msgs) - ln.heldFrom
		s.mu.Unlock()
		close(ln.done)
		s.changed.Fire()
		if s.onChanged != nil {
			s.onChanged()
		}
		s.wg.Done()
	}()
	if ln.aborted || ctx.Err() != nil {
		return // the next owner releases the hold
	}
	if ln.cut && ln.next == ln.heldFrom {
		// Handed back without running anything since the hold: the next
		// owner's release of stale holds puts its events back, one call
		// for every such key instead of a settlement each.
		return
	}
	h := Held[M, K]{Key: ln.key, Head: ln.msgs[ln.heldFrom], Handled: ln.msgs[ln.heldFrom:ln.next], Results: ln.results[ln.heldFrom:ln.next]}
	if err := s.host.SettleHeld(ctx, h); err != nil {
		s.mu.Lock()
		if s.broken == nil {
			s.broken = err
		}
		s.mu.Unlock()
	}
}

// runLane runs one lane's handlers from msgs[from] on (from > 0: the
// earlier ones ran, or were abandoned, in the chunk's inline start), then
// reports on doneCh or, when its key was held, settles the key.
func (s *Slot[M, K]) runLane(ctx context.Context, ln *lane[M, K], from int, pause, placed bool, doneCh chan<- *lane[M, K]) {
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
	// The lane takes its places for its first event (or is handed the
	// inline run's, placed) and keeps them until it ends. Giving them back
	// after each event sent it to the back of the semaphores' queues: with
	// hundreds of keys' lanes waiting (a backlog being caught up), a hot
	// key ran one event per turn of all of them, and its chunk, which ends
	// with its longest lane, took as long.
	cut := false
	for i := from; i < len(ln.msgs) && !stop; i++ {
		m := ln.msgs[i]
		if !placed && !s.acquire(ctx) {
			cut = ctx.Err() == nil
			break
		}
		placed = true
		if s.handedBack() {
			cut = true
			break
		}
		ln.mu.Lock()
		ln.started, ln.running = time.Now(), true
		ln.mu.Unlock()
		err := s.host.Run(ctx, m)
		ln.mu.Lock()
		ln.running = false
		ln.ranFor += time.Since(ln.started)
		ln.runs++
		if ctx.Err() == nil {
			ln.results[i] = err
			ln.next = i + 1
		}
		ln.mu.Unlock()
		stop = ctx.Err() != nil || (err != nil && pause)
	}
	if placed {
		s.release()
	}
	ln.mu.Lock()
	ln.finished = true
	ln.aborted = ctx.Err() != nil
	if cut && !ln.aborted && ln.next < len(ln.msgs) {
		// Handed back: the key is held from its first event not run
		// (markBack may have held it from there already).
		ln.cut = true
		if !ln.held {
			ln.held, ln.heldFrom = true, ln.next
		}
	}
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
	s.settleHeld(ctx, ln)
}

// inlineRun is the start of a chunk: its events one after another in
// ev_id order on one goroutine, until a handler runs for FanOutAfter.
type inlineRun[M Event[K], K comparable] struct {
	msgs  []M
	pause bool
	// prevs are the held lanes of earlier chunks still running, by key:
	// a key's event waits for them (one handler per key at a time).
	prevs map[K]*lane[M, K]

	mu      sync.Mutex
	next    int        // index after the last message finished
	results []error    // per message, valid below next
	failed  map[K]bool // under pause: keys failed in the chunk
	cur     int        // the running message's index
	started time.Time  // when it started
	begin   time.Time  // when the first message started
	running bool
	// handoff, once set, is the lane the running message heads: the
	// goroutine starts no further message of the chunk inline and goes
	// on with that lane.
	handoff *lane[M, K]
	// suspect is when awaitInline first found the run slow, zero when it
	// did not at its last look.
	suspect time.Time
	aborted bool
	cut     bool          // stopped by HandBack before its last event
	done    chan struct{} // closed when the inline run ends
	counted *atomic.Int32 // the count of inline runs this one is in
	// peeled: this run is what an earlier split of its chunk left inline
	// (every key but the one found slow, whose lane is peeledFrom). Its
	// own split, if one comes, gives every key a lane.
	peeled     bool
	peeledFrom *lane[M, K]
}

// newInline prepares the inline run of a chunk.
func (s *Slot[M, K]) newInline(msgs []M, pause bool) *inlineRun[M, K] {
	in := &inlineRun[M, K]{msgs: msgs, pause: pause, results: make([]error, len(msgs)), done: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held) > 0 {
		for _, m := range msgs {
			k := m.Key()
			if p := s.held[k]; p != nil {
				if in.prevs == nil {
					in.prevs = make(map[K]*lane[M, K])
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
func (s *Slot[M, K]) runInline(ctx context.Context, in *inlineRun[M, K], doneCh chan<- *lane[M, K]) {
	if !s.acquire(ctx) {
		in.end(ctx.Err() != nil)
		return
	}
	s.pool.inline.Add(1)
	in.counted = &s.pool.inline
	for i, m := range in.msgs {
		k := m.Key()
		in.mu.Lock()
		skip := in.failed[k]
		in.mu.Unlock()
		if skip {
			continue
		}
		if p := in.prevs[k]; p != nil && !s.waitPrev(ctx, p) {
			in.end(ctx.Err() != nil)
			return
		}
		in.mu.Lock()
		if ctx.Err() != nil || in.handoff != nil {
			in.mu.Unlock()
			break
		}
		if s.handedBack() {
			in.cut = true
			in.mu.Unlock()
			break
		}
		in.cur, in.started, in.running = i, time.Now(), true
		if in.begin.IsZero() {
			in.begin = in.started
		}
		in.mu.Unlock()
		err := s.host.Run(ctx, m)
		in.mu.Lock()
		in.running = false
		ln := in.handoff
		if ln == nil && ctx.Err() == nil {
			in.results[i], in.next = err, i+1
			if err != nil && in.pause {
				if in.failed == nil {
					in.failed = make(map[K]bool)
				}
				in.failed[k] = true
			}
		}
		in.mu.Unlock()
		if ln != nil {
			// The running key's lane goes on under the run's places.
			in.end(false)
			ln.mu.Lock()
			ln.running = false
			if ctx.Err() == nil {
				ln.results[0], ln.next = err, 1
			}
			ln.mu.Unlock()
			s.runLane(ctx, ln, 1, in.pause, true, doneCh)
			return
		}
		if ctx.Err() != nil {
			break
		}
	}
	s.release()
	in.end(ctx.Err() != nil)
}

// waitPrev waits for an earlier held lane of a key to exit, without the
// running-handler place the inline run holds (that lane may need one), and
// takes the place again. It reports false, holding no place, when ctx
// ended.
func (s *Slot[M, K]) waitPrev(ctx context.Context, p *lane[M, K]) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	s.release()
	select {
	case <-p.done:
	case <-ctx.Done():
		return false
	case <-s.back:
		return false
	}
	return s.acquire(ctx)
}

// end marks the inline run over and wakes awaitInline.
func (in *inlineRun[M, K]) end(aborted bool) {
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
// FanOutAfter first, the run is split (see split); it returns the lanes,
// how many of them report on doneCh, and the new inline run of the other
// keys when the split left one, which the caller awaits in turn.
func (s *Slot[M, K]) awaitInline(ctx context.Context, in *inlineRun[M, K], doneCh chan<- *lane[M, K]) ([]*lane[M, K], int, *inlineRun[M, K]) {
	every := FanOutAfter
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-in.done:
			in.mu.Lock()
			defer in.mu.Unlock()
			lanes := []*lane[M, K]{{msgs: in.msgs, results: in.results, next: in.next, finished: true, aborted: in.aborted}}
			if in.aborted || !(in.cut || s.handedBack()) {
				return lanes, 0, nil
			}
			back := s.backLanes(ctx, in, doneCh)
			return append(lanes, back...), len(back), nil
		case <-timer.C:
			// Not the timer's value: when this goroutine waited for a
			// CPU, it is older than the handler's start.
			sp := s.split(ctx, in, time.Now(), every, doneCh)
			if sp.lanes != nil {
				return sp.lanes, len(sp.lanes) - 1, sp.rest
			}
			// The handlers were fast: look less often. Every look wakes
			// a goroutine, which a busy machine pays for on every chunk
			// of every slot; a handler that turns slow between two looks
			// is caught at most checkMax late.
			every = min(2*every, checkMax)
			timer.Reset(sp.wait)
		}
	}
}

// split is what a look at an inline run decided: the lanes it was split
// into (nil: not split) and the new inline run of the other keys when the
// split left one, or how long to wait before looking again.
type split[M Event[K], K comparable] struct {
	lanes []*lane[M, K]
	rest  *inlineRun[M, K]
	wait  time.Duration
}

// split splits the inline run if its handler has run for FanOutAfter by
// now; otherwise it says how long to wait before looking again (every
// when nothing suggests sooner). The first lane is the run's finished
// part; the second is the running event's key, headed by that event, which
// the run's goroutine goes on with. A run's first split stops there (see
// peel): the events of the other keys become a new inline run. One slow
// key among fast ones then costs a goroutine, not one per key, and a fast
// handler that only looked slow (its process short of CPU) moves one key
// off the sequential path, not all of them. A run left by an earlier split
// gives every other key a lane of its own: a second slow key means the
// chunk's keys are slow, and they should overlap.
func (s *Slot[M, K]) split(ctx context.Context, in *inlineRun[M, K], now time.Time, every time.Duration, doneCh chan<- *lane[M, K]) split[M, K] {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !in.running {
		// Between two handlers, or waiting for a place: look again later,
		// to cut the chunk at a running handler.
		return split[M, K]{wait: every}
	}
	if wait, slow := s.slow(in, now, every); !slow {
		return split[M, K]{wait: wait}
	}
	cur := in.cur
	// Events below cur are finished, or not handled because their key
	// failed under pause: the chunk's ack settles them.
	lanes := []*lane[M, K]{{msgs: in.msgs[:cur], results: in.results[:cur], next: cur, finished: true}}
	if !in.peeled {
		return s.peel(ctx, in, lanes, doneCh)
	}
	lanes = append(lanes, byKey(in.msgs[cur:], in.failed)...)
	for _, ln := range lanes[2:] {
		// The head's key waited for its earlier lane already.
		ln.prev = in.prevs[ln.key]
	}
	head := lanes[1]
	head.running, head.started = true, in.started
	in.handoff = head
	for _, ln := range lanes[2:] {
		go s.runLane(ctx, ln, 0, in.pause, false, doneCh)
	}
	return split[M, K]{lanes: lanes}
}

// slow decides whether the running handler of in (in.mu held) makes the
// run slow enough to split by now; when not, wait is how long to wait
// before looking again.
func (s *Slot[M, K]) slow(in *inlineRun[M, K], now time.Time, every time.Duration) (wait time.Duration, slow bool) {
	// When more chunks run inline than there are CPUs and their handlers
	// compute, they take turns on them, and a handler's time includes
	// waiting for its turn: that is a busy process, not a slow key, and
	// lanes would only add work. The thresholds grow with the queue, while
	// goroutines do wait for a CPU (cpushort.go): handlers that wait on
	// I/O leave the CPUs free, and their slowness is their own.
	after, mean := FanOutAfter, slowMean
	if q := int(s.pool.inline.Load()) / max(s.pool.procs, 1); q > 1 && s.pool.cpuShort(now) {
		after, mean = after*time.Duration(q), mean*time.Duration(q)
	}
	ran := now.Sub(in.started)
	// A run left by a peel whose peeled key is still in a handler that has
	// run for as long: two keys slow at once are slow keys, not a busy
	// process. Its handler is then held to the unscaled threshold, and
	// split without a grace.
	corroborated := in.peeledFrom != nil && in.peeledFrom.runningFor(now) >= after
	slow = ran >= after || (corroborated && ran >= FanOutAfter)
	if el := now.Sub(in.begin); !slow && el >= after && in.cur > 0 {
		slow = el >= time.Duration(in.cur)*mean
	}
	if !slow {
		in.suspect = time.Time{}
		if ran >= after/2 {
			// This one may be turning slow: look when it would be.
			return after - ran, false
		}
		return every, false
	}
	// A process short of CPU makes a fast handler look slow: it waits
	// for its turn while the clock runs. Split only if it still looks
	// slow a grace later, when this goroutine has had a turn too; a fast
	// handler has returned by then.
	switch {
	case corroborated:
	case in.suspect.IsZero():
		in.suspect = now
		return after, false
	case now.Sub(in.suspect) < after:
		return after - now.Sub(in.suspect), false
	}
	return 0, true
}

// peel is a run's first split (see split), with in.mu held: the running
// key's events from the running one on become its lane, which the run's
// goroutine goes on with, and the other keys' events a new inline run,
// started here. lanes holds the run's finished part.
func (s *Slot[M, K]) peel(ctx context.Context, in *inlineRun[M, K], lanes []*lane[M, K], doneCh chan<- *lane[M, K]) split[M, K] {
	k := in.msgs[in.cur].Key()
	// The head's key waited for its earlier lane already (no prev).
	head := newLane[M](k)
	var others []M
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
		return split[M, K]{lanes: lanes}
	}
	// Earlier chunks' held lanes still bind the other keys: the new run
	// waits for them as this one would have.
	rest := &inlineRun[M, K]{msgs: others, pause: in.pause, prevs: in.prevs, peeled: true, peeledFrom: head,
		results: make([]error, len(others)), done: make(chan struct{})}
	go s.runInline(ctx, rest, doneCh)
	return split[M, K]{lanes: lanes, rest: rest}
}

// acquire takes a running-handler place in the slot and in the process.
// It gives up, reporting false, when ctx ends or the slot is handed back.
func (s *Slot[M, K]) acquire(ctx context.Context) bool {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return false
	case <-s.back:
		return false
	}
	select {
	case s.pool.workers <- struct{}{}:
	case <-ctx.Done():
		<-s.sem
		return false
	case <-s.back:
		<-s.sem
		return false
	}
	s.pool.addRunning(1)
	return true
}

// release gives back the place acquire took.
func (s *Slot[M, K]) release() {
	s.pool.addRunning(-1)
	<-s.pool.workers
	<-s.sem
}

// markHolds marks as held, from their first unfinished event, the lanes
// whose running handler has run for holdAfter by now, or whose events left
// would take busyHoldFactor hold times (holdableAt), and returns them. A
// lane waiting for a place in a semaphore, or for its turn on the CPU
// between fast handlers, is not a slow key: holding it would only cost
// writes.
func markHolds[M Event[K], K comparable](lanes []*lane[M, K], now time.Time, holdAfter time.Duration) []*lane[M, K] {
	var out []*lane[M, K]
	for _, ln := range lanes {
		ln.mu.Lock()
		if ln.holdableAt(now, holdAfter) {
			ln.held, ln.heldFrom = true, ln.next
			out = append(out, ln)
		}
		ln.mu.Unlock()
	}
	return out
}

// markBack marks as held, once the slot is being given up, every lane not
// through its events: from the event it runs, or the first it has not
// started. A lane that stopped on a failure under pause is not held (its
// key's later events wait for the nack); lanes that held themselves on
// seeing the hand back are returned too.
func markBack[M Event[K], K comparable](lanes []*lane[M, K], pause bool) []*lane[M, K] {
	var out []*lane[M, K]
	for _, ln := range lanes {
		ln.mu.Lock()
		failed := pause && ln.next > 0 && ln.results[ln.next-1] != nil
		if !ln.held && !ln.finished && !ln.aborted && ln.next < len(ln.msgs) && !failed {
			ln.held, ln.heldFrom = true, ln.next
		}
		if ln.held {
			out = append(out, ln)
		}
		ln.mu.Unlock()
	}
	return out
}

// byKey splits msgs into one new lane per key, in the order of each key's
// first event, leaving out the keys failed under pause (their events are
// not handled: the chunk's nack defers them).
func byKey[M Event[K], K comparable](msgs []M, failed map[K]bool) []*lane[M, K] {
	lanes := make(map[K]*lane[M, K])
	var out []*lane[M, K]
	for _, m := range msgs {
		k := m.Key()
		if failed[k] {
			continue
		}
		ln := lanes[k]
		if ln == nil {
			ln = newLane[M](k)
			lanes[k] = ln
			out = append(out, ln)
		}
		ln.msgs = append(ln.msgs, m)
	}
	for _, ln := range out {
		ln.results = make([]error, len(ln.msgs))
	}
	return out
}

// backLanes turns what a handed-back inline run did not start into one
// held lane per key (but keys failed under pause), each from its first
// event; in.mu is held. Each waits for the chunk's settlement on a
// goroutine of its own, as a held runLane does: settles its key when the
// holds landed, reports on doneCh when they did not.
func (s *Slot[M, K]) backLanes(ctx context.Context, in *inlineRun[M, K], doneCh chan<- *lane[M, K]) []*lane[M, K] {
	out := byKey(in.msgs[in.next:], in.failed)
	for _, ln := range out {
		ln.finished, ln.cut, ln.held = true, true, true
		go func() {
			<-ln.decided
			if !ln.holdOK {
				doneCh <- ln
				return
			}
			s.settleHeld(ctx, ln)
		}()
	}
	return out
}

// runningFor is how long the lane's running handler has run by now, 0
// when none runs.
func (ln *lane[M, K]) runningFor(now time.Time) time.Duration {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if !ln.running || ln.finished {
		return 0
	}
	return now.Sub(ln.started)
}

// slowAt reports whether the lane's running handler has run for holdAfter
// by now (ln.mu held).
func (ln *lane[M, K]) slowAt(now time.Time, holdAfter time.Duration) bool {
	return !ln.finished && ln.running && ln.next < len(ln.msgs) && now.Sub(ln.started) >= holdAfter
}

// aheadAt reports whether the lane runs a handler with events left that,
// at the mean of its handlers so far (two at least), would keep its chunk
// open for busyHoldFactor hold times more (ln.mu held): a hot key's share
// of a chunk, known for what it is before it has kept the chunk open.
func (ln *lane[M, K]) aheadAt(holdAfter time.Duration) bool {
	if ln.finished || !ln.running || ln.runs < 2 {
		return false
	}
	return time.Duration(len(ln.msgs)-ln.next)*(ln.ranFor/time.Duration(ln.runs)) >= busyHoldFactor*holdAfter
}

// holdableAt reports whether the lane is to be held at now: its handler is
// slow, or its events left are many (ln.mu held). A hold time of 0 holds
// every lane running a handler.
func (ln *lane[M, K]) holdableAt(now time.Time, holdAfter time.Duration) bool {
	return ln.slowAt(now, holdAfter) || (holdAfter > 0 && ln.aheadAt(holdAfter))
}

// slowLanes counts the lanes that markHolds would hold at now.
func slowLanes[M Event[K], K comparable](lanes []*lane[M, K], now time.Time, holdAfter time.Duration) int {
	n := 0
	for _, ln := range lanes {
		ln.mu.Lock()
		if ln.holdableAt(now, holdAfter) {
			n++
		}
		ln.mu.Unlock()
	}
	return n
}
