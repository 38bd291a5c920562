package pgque

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/lanes"
	"github.com/pgque/pgque/internal/startstop"
	"github.com/pgque/pgque/internal/workerpool"
)

// PartitionedConsumer is one process's worker pool over the N slots of a
// consumer. Any number of processes (each with its own WorkerID) share the
// slots without further configuration: every slot is claimed by exactly one
// live worker at a time, each claimed slot is worked by its own goroutine,
// chunk after chunk, so events of one key are handled in ev_id order by one
// worker at a time, and the processes converge to an even spread of slots.
// See docs/worker-pool.md. Create it with Client.NewPartitionedConsumer.
type PartitionedConsumer struct {
	client  *Client
	config  PartitionedConsumerConfig
	invoker invoker
	pool    *workerpool.Pool
	service startstop.Service
	// policy is the failure policy persisted for the consumer, as last read
	// from the server: Start reads it, and settling a chunk with failures
	// checks it again.
	policy atomic.Int32

	// Key lanes (lanes.go, internal/lanes): lanePool bounds running
	// handlers across the owned slots; lanes is the state of each owned
	// slot.
	lanePool *lanes.Pool
	lanesMu  sync.Mutex
	lanes    map[int]*slotState

	// ackFoldWait bounds how long a slot's deferred acknowledgement waits
	// for its next wake-up (ackFoldWait in lanes.go; tests lengthen it).
	ackFoldWait time.Duration

	// gather makes the receives of slots woken together one call
	// (gather.go); nil without GatherReceives.
	gather *receiveGather

	// workHook, when set (by tests, before Start), is told the slot of
	// every chunk call the pool makes.
	workHook func(slot int)

	// stopping is set by Stop: an acknowledgement that fails from then on
	// is one Stop reports (workerpool.Pool.NoteStopError).
	stopping atomic.Bool
}

// NewPartitionedConsumer returns a PartitionedConsumer; Start runs it.
func (c *Client) NewPartitionedConsumer(config *PartitionedConsumerConfig) (*PartitionedConsumer, error) {
	if err := config.validate(); err != nil {
		return nil, err
	}
	cfg := config.withDefaults()
	statusInterval := cfg.SlotStatusInterval
	switch {
	case statusInterval < 0 || (statusInterval == 0 && !c.observed):
		statusInterval = 0
	case statusInterval == 0:
		statusInterval = SlotStatusIntervalDefault
	}
	pc := &PartitionedConsumer{client: c, config: cfg, lanes: make(map[int]*slotState), ackFoldWait: ackFoldWait}
	running := c.metrics.LanesRunning.WithLabelValues(cfg.Queue, cfg.Consumer)
	pc.lanePool = lanes.NewPool(cfg.MaxWorkers, runtime.GOMAXPROCS(0), cfg.HoldAfter, func(n int) { running.Set(float64(n)) })
	work := pc.work
	if cfg.MaxWorkersPerSlot > 1 {
		work = pc.workLanes
	}
	inner := work
	work = func(fetchCtx, workCtx context.Context, lease *workerpool.Lease) (bool, error) {
		if pc.workHook != nil {
			pc.workHook(lease.Slot)
		}
		more, err := inner(fetchCtx, workCtx, lease)
		if pc.gather != nil {
			pc.lanesOf(lease).waited = err == nil && !more
		}
		return more, err
	}
	if cfg.GatherReceives {
		q := c.queries
		pc.gather = &receiveGather{window: gatherWindowDefault, log: c.logger,
			single: func(ctx context.Context, r dbq.SlotReceive) ([]dbq.Row, error) {
				return q.ReceivePartitioned(ctx, cfg.Queue, cfg.Consumer, r.Slot, r.NSlots, cfg.WorkerID, r.Token, cfg.BatchSize, r.Ack)
			},
			many: func(ctx context.Context, calls []dbq.SlotReceive) ([][]dbq.Row, error) {
				return q.ReceivePartitionedSlots(ctx, cfg.Queue, cfg.Consumer, cfg.WorkerID, cfg.BatchSize, calls)
			}}
	}
	complete := func(ctx context.Context, q *dbq.Queries, m *Message) error {
		d := dbq.Delivery{Epoch: m.Epoch, BatchID: m.BatchID, MsgID: m.ID}
		return q.CompleteDelivery(ctx, cfg.Queue, cfg.Consumer, m.Slot, m.NSlots, cfg.WorkerID, m.token, d, m.ID)
	}
	pc.invoker = invoker{handler: handlerOf(cfg.Handler, cfg.HandlerTx, c.pool, complete), queue: cfg.Queue, consumer: cfg.Consumer, logger: c.logger, metrics: c.metrics,
		observer: c.config.Observer, timeout: cfg.HandlerTimeout, inFlight: &inFlight{}}
	pc.service.Running = pc.invoker.inFlight.list
	pc.pool = workerpool.New(workerpool.Config{
		Queries:        c.queries,
		Notifier:       c.notifier,
		Logger:         c.logger,
		Metrics:        c.metrics,
		OnError:        c.reportError,
		Queue:          cfg.Queue,
		Consumer:       cfg.Consumer,
		Worker:         cfg.WorkerID,
		Slots:          cfg.Slots,
		HotKeyShare:    max(cfg.HotKeyShare, 0),
		MaxActive:      config.MaxActiveSlots, // 0: all N, whatever N becomes
		LeaseTTL:       cfg.LeaseTTL,
		ClaimInterval:  cfg.ClaimInterval,
		PollInterval:   cfg.PollInterval,
		StatusInterval: statusInterval,
		Work:           work,
		Drain:          pc.drain,
		IsLeaseLost:    func(err error) bool { return errors.Is(err, ErrLeaseLost) },
		LeaseLostCause: ErrLeaseLost,
		IsSlotCountChanged: func(err error) bool {
			return errors.Is(err, ErrSlotCountMismatch) || errors.Is(err, ErrSlotNotSubscribed)
		},
		OnSlot: onSlot(cfg.OnSlot),
	})
	return pc, nil
}

// WorkerID returns the id this process uses in slot leases.
func (pc *PartitionedConsumer) WorkerID() string { return pc.config.WorkerID }

// Slots returns the N this pool works now: Slots from its config, or the
// consumer's N after a resize.
func (pc *PartitionedConsumer) Slots() int { return pc.pool.Slots() }

// OwnedSlots returns the slots this process works right now.
func (pc *PartitionedConsumer) OwnedSlots() []int { return pc.pool.Owned() }

// Policy returns the failure policy the pool follows: the one persisted for
// the consumer, as last read from the server (0 before Start).
func (pc *PartitionedConsumer) Policy() FailurePolicy { return FailurePolicy(pc.policy.Load()) }

// Start subscribes all N slots (idempotently; a different N persisted for
// the consumer fails with ErrSlotCountMismatch, a different failure policy
// with ErrPolicyMismatch) and starts the worker pool in the background. It
// returns at once. When the consumer was resized (Client.ResizeSlots) from
// Slots, or is being resized to Slots, the pool works the consumer's
// current N instead, and it follows every later resize by itself. Cancelling ctx abandons everything like a crash: nothing
// more is acked, leases expire after the TTL.
func (pc *PartitionedConsumer) Start(ctx context.Context) error {
	cfg := &pc.config
	if err := pc.client.CheckSchema(ctx); err != nil {
		return err
	}
	nslots, err := pc.startSlots(ctx)
	if err != nil {
		return err
	}
	pc.pool.SetSlots(nslots)
	var persisted FailurePolicy
	var missed int64
	err = pgx.BeginFunc(ctx, pc.client.pool, func(tx pgx.Tx) error {
		q := dbq.New(tx)
		created, err := subscribeSlotsTx(ctx, q, cfg.Queue, cfg.Consumer, nslots, cfg.FailurePolicy)
		if err != nil {
			return err
		}
		if created > 0 {
			if missed, err = newSubscriptionMissed(ctx, q, cfg.Queue, cfg.Consumer, cfg.StartFromOldest); err != nil {
				return err
			}
		}
		persisted, err = serverPolicy(ctx, q, cfg.Queue, cfg.Consumer)
		return err
	})
	if err != nil {
		return mapError(fmt.Sprintf("subscribing %d slots of %q to queue %q", nslots, cfg.Consumer, cfg.Queue), err)
	}
	if missed > 0 {
		// The usual cause is a deployment that started the producers before
		// the consumer's first start: what they sent is not this
		// consumer's, and nothing else says so.
		pc.client.logger.WarnContext(ctx, "pgque: subscribed a consumer to a queue that already had events: the events sent before it are not delivered to it; subscribe before the producers start (pgque slots subscribe), or set StartFromOldest to receive what the queue still keeps",
			slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int64("events_missed", missed),
			slog.Bool("start_from_oldest", cfg.StartFromOldest))
	}
	pc.policy.Store(int32(persisted))
	if err := pc.service.Start(ctx, pc.pool.Run); err != nil {
		return fmt.Errorf("starting partitioned consumer %q: %w", pc.config.Consumer, ErrAlreadyStarted)
	}
	return nil
}

// Stop stops claiming and receiving, lets each slot's running handlers
// finish, hands back the events of its chunk in flight that have not
// started (their keys are held and put back in order for the next
// owner), acks the rest, releases the leases, and returns when every
// goroutine is gone. If ctx ends first, the chunks in flight are abandoned unacked (their
// handlers' contexts are cancelled; the next owner receives them again after
// the TTL) and ctx's error is returned. A handler that ignores its
// cancelled context does not hold Stop: one second later Stop returns an
// error that wraps ctx's and names the handlers still running (their
// goroutines exit when they return). When every goroutine is gone but a
// chunk could not be acknowledged or a lease not released (the database
// went away meanwhile), Stop returns an error saying so, which wraps what
// failed: those chunks are delivered again, and a slot whose lease was
// not released waits for its TTL. Stop is idempotent.
func (pc *PartitionedConsumer) Stop(ctx context.Context) error {
	pc.stopping.Store(true)
	err := pc.service.Stop(ctx)
	if serr := pc.pool.StopErr(); serr != nil {
		cfg := &pc.config
		serr = fmt.Errorf("pgque: stopping consumer %q of queue %q: not everything in flight was acknowledged and released "+
			"(delivered again; an unreleased slot is free after its lease TTL): %w", cfg.Consumer, cfg.Queue, serr)
		err = errors.Join(err, serr)
	}
	return err
}

// work processes one chunk of a held slot (a workerpool.WorkFunc).
func (pc *PartitionedConsumer) work(fetchCtx, workCtx context.Context, lease *workerpool.Lease) (bool, error) {
	cfg := &pc.config
	sl := pc.lanesOf(lease)
	c, err := pc.receiveChunk(fetchCtx, workCtx, sl)
	if err != nil || c.msgs == nil {
		return false, err
	}
	// Handlers are bounded by HandlerTimeout, not by the pool's watchdog.
	handled := lease.Busy()
	run := pc.invoker.handleChunk(workCtx, c.msgs, c.policy == FailurePolicyPause, lease.GivingUp())
	handled()
	if run.aborted {
		return false, errors.Join(errAborted, context.Cause(workCtx))
	}
	if run.held > 0 {
		pc.client.logger.DebugContext(workCtx, "pgque: holding events of failed keys",
			slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot),
			slog.Int("failed", len(run.failures)), slog.Int("held", run.held))
	}
	// Given up in the middle of the chunk: the keys of the events not
	// started are held from the first of each, as the lanes hand back,
	// and the slot's next owner puts them back (release_stale_holds).
	holds := handBack(run.rest)
	if len(holds) > 0 || !sl.deferAck(c.delivery, run.failures, run.held) {
		ackStart := time.Now()
		s := pc.chunkSettler(lease, c.policy, c.delivery)
		var err error
		if len(holds) > 0 {
			err = rerun(workCtx, func() error { return pc.settleWithHolds(workCtx, &s, run.failures, lease, c.delivery, holds) })
		} else {
			err = s.settle(workCtx, pc.client.pool, run.failures)
		}
		if err != nil {
			return false, err
		}
		lease.Renewed(ackStart)
	}
	pc.client.metrics.BatchDuration.WithLabelValues(cfg.Queue, cfg.Consumer).Observe(time.Since(c.start).Seconds())
	return pc.receiveAgain(lease, sl, c), nil
}

// handBack is the holds that hand back rest, the events of a chunk not
// started: each key's from its first.
func handBack(rest []*Message) []lanes.Hold[*Message, KeyRef] {
	var holds []lanes.Hold[*Message, KeyRef]
	seen := make(map[KeyRef]bool)
	for _, m := range rest {
		if k := m.Key(); !seen[k] {
			seen[k] = true
			holds = append(holds, lanes.Hold[*Message, KeyRef]{Key: k, Head: m})
		}
	}
	return holds
}

// startSlots is the N Start subscribes and works: Slots, or the consumer's
// N when Slots is one it had before a resize or the one it is being
// resized to (a process deployed with either config follows the server).
func (pc *PartitionedConsumer) startSlots(ctx context.Context) (int, error) {
	cfg := &pc.config
	g, err := pc.client.queries.SlotGroupInfo(ctx, cfg.Queue, cfg.Consumer)
	if errors.Is(mapError("", err), ErrSlotNotSubscribed) {
		return cfg.Slots, nil // a new consumer
	}
	if err != nil {
		return 0, mapError(fmt.Sprintf("reading the slots of %q on queue %q", cfg.Consumer, cfg.Queue), err)
	}
	if g.NSlots == cfg.Slots {
		return cfg.Slots, nil
	}
	resized := slices.Contains(g.PastNSlots, int32(cfg.Slots)) || (g.ResizeTo != nil && *g.ResizeTo == cfg.Slots)
	if !resized {
		return cfg.Slots, nil // subscribing fails with ErrSlotCountMismatch
	}
	pc.client.logger.InfoContext(ctx, "pgque: the consumer was resized; working its current slot count",
		slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer),
		slog.Int("configured", cfg.Slots), slog.Int("nslots", g.NSlots))
	return g.NSlots, nil
}

// newSubscriptionMissed is called in the transaction that created the
// consumer's subscription: it rewinds it first when fromOldest, and returns
// how many events sent before the subscription it will never receive.
func newSubscriptionMissed(ctx context.Context, q *dbq.Queries, queue, consumer string, fromOldest bool) (int64, error) {
	if fromOldest {
		if _, err := q.RewindNewSubscription(ctx, queue, consumer); err != nil {
			return 0, err
		}
	}
	return q.EventsBeforeSubscription(ctx, queue, consumer)
}

// onSlot adapts PartitionedConsumerConfig.OnSlot to the pool's hook.
func onSlot(f func(SlotChange)) func(slot, nslots int, epoch int64, ended, fenced bool) {
	if f == nil {
		return nil
	}
	return func(slot, nslots int, epoch int64, ended, fenced bool) {
		f(SlotChange{Slot: slot, NSlots: nslots, Epoch: epoch, Ended: ended, Fenced: fenced})
	}
}
