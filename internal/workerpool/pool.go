package workerpool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/notifier"
	"github.com/pgque/pgque/internal/wakeup"
)

// Channel names the pool listens on.
const (
	// TickChannel carries TickTag(queue) after every tick.
	TickChannel = "pgque"
	// PresenceChannel carries worker announcements (see presence.go).
	PresenceChannel = "pgque_workers"
)

// TickTag is the payload of queue's tick notifications (pgque._tick_tag):
// 16 hex digits of sha256("tick:" + queue), so that LISTENers of other
// roles do not read queue names from the channel.
func TickTag(queue string) string {
	sum := sha256.Sum256([]byte("tick:" + queue))
	return hex.EncodeToString(sum[:8])
}

// WorkFunc processes at most one chunk of the slot held by lease. fetchCtx
// ends when the pool stops fetching (receive must use it); workCtx ends when
// the work must be abandoned: the lease was lost or the pool is hard-stopped
// (handlers and ack use it). It reports whether the slot may have more work
// right away. Each successful receive or ack must call lease.Renewed with the
// time the call started, because the server renews the lease on both.
type WorkFunc func(fetchCtx, workCtx context.Context, lease *Lease) (more bool, err error)

// Config configures a Pool. Every field is required unless noted.
type Config struct {
	Queries  *dbq.Queries
	Notifier *notifier.Notifier // nil: poll only
	Logger   *slog.Logger
	Metrics  *metrics.Metrics

	Queue, Consumer, Worker string
	// Slots is N when the pool starts; the pool follows a resize of the
	// consumer (see resize.go). MaxActive caps the slots it works; 0 means
	// all N.
	Slots, MaxActive int
	LeaseTTL         time.Duration
	ClaimInterval    time.Duration
	PollInterval     time.Duration
	// StatusInterval is how often the per-slot gauges are refreshed from
	// partition_slot_status; 0 disables the refresh.
	StatusInterval time.Duration
	// HotKeyShare: with the status refresh, warn when one key holds more
	// than this share of a slot's pending events; 0 disables.
	HotKeyShare float64
	// StallTimeout: the watchdog gives a slot up when its loop showed no
	// progress for this long outside its handlers (see stall.go).
	// 0: twice LeaseTTL, at least a minute.
	StallTimeout time.Duration
	// StallCheckInterval is how often partition_slot_stalls is read for
	// the stalled-slot gauge and warning. 0: 10 × ClaimInterval; negative
	// disables.
	StallCheckInterval time.Duration

	Work WorkFunc
	// Drain, when set, is called once the slot's goroutine stops working a
	// lease, before the lease is released (or abandoned): it must return
	// only when no work of that lease runs any more. ctx is the slot's
	// work context: ended when the slot was fenced or the pool hard-stopped
	// (then nothing more may be settled), alive on a graceful stop.
	Drain func(ctx context.Context, lease *Lease)
	// IsLeaseLost reports whether an error from Work means the server fenced
	// this worker (SQLSTATE PQ032).
	IsLeaseLost func(error) bool
	// LeaseLostCause is the cause a slot's workCtx is cancelled with when
	// its lease is lost.
	LeaseLostCause error
	// IsSlotCountChanged reports whether an error from Work means the
	// consumer's N is no longer the lease's (SQLSTATE PQ030): the slot's
	// goroutine stops and the pool reads the new N (optional).
	IsSlotCountChanged func(error) bool
	// OnError, when set, receives each error the pool logs and then
	// retries after a backoff (optional).
	OnError func(context.Context, error)
	// OnSlot, when set, is called with ended false when a runner starts on
	// a claimed slot, and with ended true when it exits; fenced says its
	// workCtx ended with LeaseLostCause (optional).
	OnSlot func(slot, nslots int, epoch int64, ended, fenced bool)
}

// reportError hands err to Config.OnError, if set.
func (p *Pool) reportError(ctx context.Context, err error) {
	if p.cfg.OnError != nil {
		p.cfg.OnError(ctx, err)
	}
}

// stopErrsMax bounds the errors StopErr keeps: one is enough to tell, a few
// to show whether it was one slot or all.
const stopErrsMax = 8

// NoteStopError records err as one that left work in flight unacknowledged
// or a lease unreleased during a graceful stop (StopErr). An error of a
// cancelled context is the stop's own doing, not such a failure.
func (p *Pool) NoteStopError(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	p.stopMu.Lock()
	defer p.stopMu.Unlock()
	if len(p.stopErrs) < stopErrsMax {
		p.stopErrs = append(p.stopErrs, err)
	}
}

// StopErr returns the errors NoteStopError recorded (at most stopErrsMax),
// joined; nil when the stop acknowledged and released everything.
func (p *Pool) StopErr() error {
	p.stopMu.Lock()
	defer p.stopMu.Unlock()
	return errors.Join(p.stopErrs...)
}

// Pool is one process's worker pool over the slots of one consumer.
type Pool struct {
	cfg      Config
	presence *presence
	trigger  *wakeup.Signal
	runners  sync.WaitGroup

	// nslots is the N the pool works now (resize.go).
	nslots atomic.Int64
	// sets: the server has sent a touched set (see dispatch).
	sets atomic.Bool

	// stopErrs: what a graceful stop failed to acknowledge or release
	// (NoteStopError, StopErr).
	stopMu   sync.Mutex
	stopErrs []error

	mu       sync.Mutex
	running  map[int]*runner
	holdoff  map[int]time.Time
	prevFree map[int]bool

	// announceGrace is how long a graceful stop lets a pass's
	// announcement under way go on (see pass): announceGrace, or what a
	// test set.
	announceGrace time.Duration
}

// SetAnnounceGrace sets how long a graceful stop lets a pass's
// announcement under way go on, for tests that hold it longer than the
// default; call it before Run.
func (p *Pool) SetAnnounceGrace(d time.Duration) { p.announceGrace = d }

// New returns a Pool; Run starts it.
func New(cfg Config) *Pool {
	p := &Pool{
		cfg:      cfg,
		presence: newPresence(cfg.Queue, cfg.Consumer, cfg.Worker, 3*cfg.ClaimInterval),
		trigger:  wakeup.NewSignal(),
		running:  make(map[int]*runner),
		holdoff:  make(map[int]time.Time),
		prevFree: make(map[int]bool),

		announceGrace: announceGrace,
	}
	p.nslots.Store(int64(cfg.Slots))
	return p
}

// Run works slots until fetchCtx ends, then lets every slot finish its
// in-flight chunk, ack and release its lease, and returns once all slot
// goroutines have exited. If workCtx ends first (hard stop or crash), slots
// are abandoned: no ack, no release; their leases expire after the TTL.
func (p *Pool) Run(fetchCtx, workCtx context.Context) {
	var notify, slots, announce <-chan string
	if n := p.cfg.Notifier; n != nil {
		tag := TickTag(p.cfg.Queue)
		ticks := n.Listen(TickChannel, func(payload string) bool { return payload == tag })
		defer ticks.Unlisten()
		touchedSub := n.Listen(SlotsChannel, func(payload string) bool { return strings.HasPrefix(payload, tag+":") })
		defer touchedSub.Unlisten()
		peers := n.Listen(PresenceChannel, nil) // a hint only: see presence.go
		defer peers.Unlisten()
		notify, slots, announce = ticks.C(), touchedSub.C(), peers.C()
		// Removed before the subscriptions: the last of them leaving ends
		// the session, which must not fence this pool's own stop.
		defer n.OnSession(func(pid int32, up bool) { p.sessionChanged(workCtx, pid, up) })()
	}

	stopBackground := make(chan struct{})
	var background sync.WaitGroup
	background.Add(2)
	go func() { defer background.Done(); p.dispatch(stopBackground, notify, slots, announce) }()
	go func() { defer background.Done(); p.keep(workCtx, stopBackground) }()

	// The status refresher stops with fetching: it serves dashboards only.
	stopStatus := make(chan struct{})
	if p.cfg.StatusInterval > 0 {
		background.Add(1)
		go func() { defer background.Done(); p.observeStatus(fetchCtx, stopStatus) }()
	}

	if p.stallCheckInterval() > 0 {
		background.Add(1)
		go func() { defer background.Done(); p.watchStalls(fetchCtx, stopStatus) }()
	}

	p.coordinate(fetchCtx, workCtx)

	close(stopStatus)
	p.runners.Wait()
	if workCtx.Err() == nil && len(p.Owned()) == 0 {
		// A graceful stop: every runner released its slot.
		p.leave(workCtx)
	}
	close(stopBackground)
	background.Wait()
}

// Owned returns the slots this process currently works, for tests, status
// and announcements. A slot the watchdog gave up is not among them, even
// while its stuck goroutine has not exited: peers must see it as free.
func (p *Pool) Owned() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, 0, len(p.running))
	for s, r := range p.running {
		if !r.givenUp.Load() {
			out = append(out, s)
		}
	}
	return out
}

// dispatch wakes slot goroutines on tick notifications and records other
// workers' announcements. A tick's touched set (SlotsChannel) wakes only
// the slots it names; once the server has sent one, the plain tick tag is
// left to clients that cannot read the set (the server sends both for
// every tick), so an untouched slot sleeps until a tick touches it or its
// poll falls due. A server without touched sets only sends the tag, which
// wakes every slot as before. An empty payload (the LISTEN session was
// re-established, notifications may have been lost) wakes every slot.
func (p *Pool) dispatch(stop <-chan struct{}, notify, slots, announce <-chan string) {
	tag := TickTag(p.cfg.Queue)
	gap := p.cfg.ClaimInterval / 4
	// A presence hint that came within its gap, asked again when the gap
	// ends (presence.hint): one at a time.
	var later *time.Timer
	var laterC <-chan time.Time
	var laterPayload string
	defer func() {
		if later != nil {
			later.Stop()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case payload := <-notify:
			if payload == "" || !p.sets.Load() {
				p.wake(touched{all: true})
			}
		case payload := <-slots:
			if payload == "" {
				p.wake(touched{all: true})
				continue
			}
			if t, ok := parseTouched(payload, tag); ok {
				p.sets.Store(true)
				p.wake(t)
			}
		case payload := <-announce:
			now, wait := p.presence.hint(payload, time.Now(), gap)
			if now {
				p.trigger.Fire()
			} else if wait > 0 && laterC == nil {
				later, laterPayload = time.NewTimer(wait), payload
				laterC = later.C
			}
		case <-laterC:
			laterC = nil
			if now, _ := p.presence.hint(laterPayload, time.Now(), gap); now {
				p.trigger.Fire()
			}
		}
	}
}

// wake fires the runners of the slots t names.
func (p *Pool) wake(t touched) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for slot, r := range p.running {
		if t.has(r.lease.NSlots, slot) {
			r.wake.Fire()
		}
	}
}

// TouchedSets reports whether the server has sent the pool a touched set,
// from which on only touched slots wake on a tick.
func (p *Pool) TouchedSets() bool { return p.sets.Load() }

func (p *Pool) log() *slog.Logger {
	return p.cfg.Logger.With(slog.String("queue", p.cfg.Queue), slog.String("consumer", p.cfg.Consumer),
		slog.String("worker", p.cfg.Worker))
}
