package pgque

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/lanes"
	"github.com/pgque/pgque/internal/workerpool"
)

// A slot's chunks are received, settled and fenced here; with
// MaxWorkersPerSlot > 1 their handlers run in key lanes (internal/lanes,
// see docs/worker-pool.md), which call back to run a handler (Run) and to
// settle a held key (SettleHeld).

// slotState is the state of one slot under one runner (lease).
type slotState struct {
	pc        *PartitionedConsumer
	lease     *workerpool.Lease
	recovered bool
	lanes     *lanes.Slot[*Message, KeyRef]

	// ack is the last chunk, handled without failures or holds and not
	// acknowledged yet: the next receive acknowledges it in the same
	// statement, or drain does when the runner stops. Only the runner
	// goroutine uses it, and only while no lane of the slot is held (a
	// held key's settlement must not run before its chunk's ack).
	ack *dbq.Delivery
	// waited is set when the slot's last Work call left it waiting for a
	// wake-up: its next receive is gathered with the other woken slots'
	// (gather.go). Only the runner goroutine uses it.
	waited bool
}

// lanesOf returns the state of lease's slot, creating it for a new runner.
func (pc *PartitionedConsumer) lanesOf(lease *workerpool.Lease) *slotState {
	pc.lanesMu.Lock()
	defer pc.lanesMu.Unlock()
	sl := pc.lanes[lease.Slot]
	if sl == nil || sl.lease != lease {
		sl = &slotState{pc: pc, lease: lease}
		sl.lanes = lanes.NewSlot(pc.lanePool, lanes.Host[*Message, KeyRef](sl), pc.config.MaxWorkersPerSlot,
			func() { pc.observeLanes(lease.Slot, sl) }, lease.GivingUp())
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
		sl.lanes.Wait()
		pc.observeLanes(lease.Slot, nil)
	}
}

// takeAck returns the slot's pending acknowledgement for the receive
// about to be sent, and forgets it: if that statement fails, it rolled
// the acknowledgement back, and the chunk is received again.
func (sl *slotState) takeAck() *dbq.Delivery {
	ack := sl.ack
	sl.ack = nil
	return ack
}

// deferAck keeps a chunk's acknowledgement for the next receive when it
// can wait: nothing failed, nothing is held in this chunk, and no held
// lane of the slot could settle its key before the ack lands. It reports
// whether it did; otherwise the caller settles the chunk at once.
func (sl *slotState) deferAck(d dbq.Delivery, failures []failure, holding int) bool {
	if len(failures) > 0 || holding > 0 || sl.lanes.Holding() > 0 {
		return false
	}
	sl.ack = &d
	return true
}

// flushAck sends the slot's pending acknowledgement on its own when its
// runner stops, unless ctx (the slot's work context) ended: a fenced or
// hard-stopped slot settles nothing, and its chunk is received again.
func (pc *PartitionedConsumer) flushAck(ctx context.Context, sl *slotState, lease *workerpool.Lease) {
	ack := sl.takeAck()
	if ack == nil || ctx.Err() != nil {
		return
	}
	cfg := &pc.config
	start := time.Now()
	err := rerun(ctx, func() error {
		_, err := pc.client.queries.AckDelivery(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, *ack)
		return err
	})
	if err != nil {
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
		if pc.stopping.Load() {
			pc.pool.NoteStopError(err)
		}
		return
	}
	lease.Renewed(start)
}

// receive asks for the slot's next chunk, with its pending
// acknowledgement; a slot woken from a wait asks together with the other
// woken slots (gather.go). When the call fails (a stop cancels it, a connection
// breaks) the acknowledgement did not land; it is sent once on its own,
// under the slot's work context, so that neither a graceful stop nor a
// passing error gives the chunk to the next owner again, and an
// acknowledgement that cannot land is not retried with every receive.
func (pc *PartitionedConsumer) receive(fetchCtx, workCtx context.Context, sl *slotState, lease *workerpool.Lease) ([]dbq.Row, error) {
	cfg := &pc.config
	ack := sl.takeAck()
	var rows []dbq.Row
	var err error
	if sl.waited && pc.gather != nil {
		rows, err = pc.gather.receive(fetchCtx, workCtx, dbq.SlotReceive{Slot: lease.Slot, NSlots: lease.NSlots, Token: lease.Token, Ack: ack})
	} else {
		rows, err = pc.client.queries.ReceivePartitioned(fetchCtx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, cfg.BatchSize, ack)
	}
	if err != nil && ack != nil {
		sl.ack = ack
		pc.flushAck(workCtx, sl, lease)
	}
	return rows, err
}

// recoverHolds releases the holds left on the slot — by an earlier owner,
// or by this process before it was fenced from the slot — once per runner,
// before the first receive: no lane of the slot runs then.
func (pc *PartitionedConsumer) recoverHolds(ctx context.Context, sl *slotState, lease *workerpool.Lease) error {
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

// slotChunk is a chunk received for a slot.
type slotChunk struct {
	msgs []*Message
	// delivery is what its settling calls prove it by (fencing at the SQL
	// level, not only in this process).
	delivery dbq.Delivery
	// policy is the failure policy it is handled under.
	policy FailurePolicy
	// start is when the work on it started.
	start time.Time
}

// receiveChunk receives the slot's next chunk (none: no msgs) once the
// holds an earlier owner left are released.
func (pc *PartitionedConsumer) receiveChunk(fetchCtx, workCtx context.Context, sl *slotState) (slotChunk, error) {
	cfg, lease := &pc.config, sl.lease
	if err := pc.recoverHolds(fetchCtx, sl, lease); err != nil {
		return slotChunk{}, err
	}
	start := time.Now()
	rows, err := pc.receive(fetchCtx, workCtx, sl, lease)
	if err != nil {
		return slotChunk{}, mapError(fmt.Sprintf("receiving slot %d", lease.Slot), err)
	}
	lease.Renewed(start)
	if len(rows) == 0 {
		return slotChunk{}, nil
	}
	if rows[0].Epoch != lease.Epoch {
		return slotChunk{}, fmt.Errorf("receiving slot %d: server epoch %d, lease epoch %d: %w", lease.Slot, rows[0].Epoch, lease.Epoch, ErrLeaseLost)
	}
	msgs := toMessages(rows, cfg.Queue, cfg.Consumer, lease.Slot)
	for _, m := range msgs {
		m.NSlots = lease.NSlots
		m.token = lease.Token
	}
	return slotChunk{msgs: msgs, delivery: dbq.Delivery{Epoch: rows[0].Epoch, BatchID: rows[0].BatchID, MsgID: rows[0].MsgID},
		policy: pc.Policy(), start: start}, nil
}

// workLanes processes one chunk of the slot with key lanes (a
// workerpool.WorkFunc).
func (pc *PartitionedConsumer) workLanes(fetchCtx, workCtx context.Context, lease *workerpool.Lease) (bool, error) {
	cfg := &pc.config
	sl := pc.lanesOf(lease)
	// Backpressure: the events detached lanes still hold in memory, plus
	// the next chunk, stay within MaxEventsPerSlot. Waiting for handlers
	// is not a stuck loop (workerpool's watchdog).
	waited := lease.Busy()
	room, err := sl.lanes.WaitRoom(fetchCtx, cfg.BatchSize, cfg.MaxEventsPerSlot)
	waited()
	if !room {
		return false, err
	}

	sl.lanes.LockChunk()
	locked := true
	defer func() {
		if locked {
			sl.lanes.UnlockChunk()
		}
	}()
	c, err := pc.receiveChunk(fetchCtx, workCtx, sl)
	if err != nil || c.msgs == nil {
		return false, err
	}
	handled := lease.Busy()
	chunk := sl.lanes.Run(workCtx, c.msgs, c.policy == FailurePolicyPause)
	handled()
	if workCtx.Err() == nil && !chunk.Aborted() {
		err = pc.settleLanes(workCtx, sl, chunk, c.policy, c.delivery)
	} else {
		err = errors.Join(errAborted, context.Cause(workCtx))
	}
	if err != nil {
		defer lease.Busy()() // the held lanes run handlers
		chunk.Abandon()
		return false, err
	}
	sl.lanes.UnlockChunk()
	locked = false
	chunk.Detach()
	pc.client.metrics.BatchDuration.WithLabelValues(cfg.Queue, cfg.Consumer).Observe(time.Since(c.start).Seconds())
	pc.observeLanes(lease.Slot, sl)
	return pc.receiveAgain(lease, sl, c), nil
}

// ackFoldWait bounds how long a deferred acknowledgement waits for the
// slot's next wake-up before it is sent on its own.
const ackFoldWait = 100 * time.Millisecond

// foldBytes: a chunk below BatchSize whose payloads, types and keys stay
// under this was not cut by the server's byte budget per chunk
// (pgque._chunk_bytes, 32 MiB, which counts every text handed out), so it
// ended the slot's batch.
const foldBytes = 1 << 20

// receiveAgain says whether the slot receives again at once after chunk
// c. A chunk that ended the slot's batch leaves the next receive nothing
// to do but acknowledge it and find no later batch: one more call and
// transaction per wake-up. So when its acknowledgement was deferred, the
// slot waits instead, and the acknowledgement rides on the receive of its
// next wake-up (a tick that touches it), or goes after ackFoldWait at the
// latest. A chunk of BatchSize, or one that may have been cut by the byte
// budget, may leave events of the batch: receive again at once.
func (pc *PartitionedConsumer) receiveAgain(lease *workerpool.Lease, sl *slotState, c slotChunk) bool {
	if sl.ack == nil || len(c.msgs) >= pc.config.BatchSize {
		return true
	}
	n := 0
	for _, m := range c.msgs {
		n += len(m.Payload) + len(m.Type) + len(m.PartitionKey)
	}
	if n >= foldBytes {
		return true
	}
	lease.CallBackWithin(pc.ackFoldWait)
	return false
}

// settleLanes settles a chunk run in lanes: with the holds of its slow
// keys in one transaction, by the next receive when it can wait, or on its
// own. When the holds do not land, the chunk falls back to the barrier of
// a chunk without holds: it waits for the held lanes and settles them with
// the rest, so that a hold that keeps failing costs throughput, never
// progress.
func (pc *PartitionedConsumer) settleLanes(ctx context.Context, sl *slotState, chunk *lanes.Chunk[*Message, KeyRef], policy FailurePolicy, delivery dbq.Delivery) error {
	cfg, lease := &pc.config, sl.lease
	failures := laneFailures(chunk.Failures())
	holds := chunk.Holds()
	ackStart := time.Now()
	s := pc.chunkSettler(lease, policy, delivery)
	var err error
	switch {
	case len(holds) > 0:
		// The holds must land with the ack: in the same transaction.
		err = rerun(ctx, func() error { return pc.settleWithHolds(ctx, &s, failures, lease, delivery, holds) })
	case sl.deferAck(delivery, failures, 0):
		// Acknowledged by the next receive.
	default:
		err = s.settle(ctx, pc.client.pool, failures)
	}
	if err != nil && len(holds) > 0 && ctx.Err() == nil && !errors.Is(err, ErrLeaseLost) {
		// The holds did not land (the transaction rolled back).
		pc.client.logger.WarnContext(ctx, "pgque: holding slow keys failed; waiting for them instead",
			slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot),
			slog.Any("error", err))
		waitHeld := lease.Busy()
		chunk.Unhold()
		waitHeld()
		if ctx.Err() != nil || chunk.Aborted() {
			return errors.Join(errAborted, context.Cause(ctx))
		}
		ackStart = time.Now()
		err = s.settle(ctx, pc.client.pool, laneFailures(chunk.Failures()))
	}
	if err != nil {
		return err
	}
	lease.Renewed(ackStart)
	return nil
}

// laneFailures converts the failures a chunk's lanes report.
func laneFailures(fs []lanes.Failure[*Message]) []failure {
	if len(fs) == 0 {
		return nil
	}
	out := make([]failure, len(fs))
	for i, f := range fs {
		out[i] = failure{msg: f.Msg, err: f.Err}
	}
	return out
}

// settleWithHolds holds the keys of holds and settles the chunk, in one
// transaction.
func (pc *PartitionedConsumer) settleWithHolds(ctx context.Context, s *settler, failures []failure, lease *workerpool.Lease, delivery dbq.Delivery, holds []lanes.Hold[*Message, KeyRef]) error {
	cfg := &pc.config
	tx, err := pc.client.pool.Begin(ctx)
	if err != nil {
		return mapError("settling chunk", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// One call for every key: a stop hands back hundreds of keys of a
	// chunk, and a call per key scanned the chunk once per key.
	keys, heads := make([]*string, len(holds)), make([]int64, len(holds))
	for i, h := range holds {
		keys[i], heads[i] = h.Key.arg(), h.Head.ID
	}
	if _, err := dbq.New(tx).HoldKeysPartitioned(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token, delivery, keys, heads); err != nil {
		return mapError(fmt.Sprintf("holding %d keys of slot %d", len(holds), lease.Slot), err)
	}
	if err := s.settleOnce(ctx, tx, failures); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return mapError("settling chunk", err)
	}
	pc.client.metrics.KeyHolds.WithLabelValues(cfg.Queue, cfg.Consumer).Add(float64(len(holds)))
	return nil
}

// Run runs one event's handler for the slot's lanes (lanes.Host).
func (sl *slotState) Run(ctx context.Context, m *Message) error { return sl.pc.invoker.call(ctx, m) }

// SettleHeld settles a held key once its lane's handlers are done
// (lanes.Host): the events it handled are dropped from the hold, failures
// retried or dead-lettered, the rest released. It retries transient
// errors; if the key cannot be settled, it returns an error that gives the
// slot up, so that its next owner releases the hold.
func (sl *slotState) SettleHeld(ctx context.Context, h lanes.Held[*Message, KeyRef]) error {
	pc, lease := sl.pc, sl.lease
	cfg := &pc.config
	var done []int64
	var failed []dbq.HeldFailure
	// The delays are those the chunk's settler gives: DeadLetter and
	// RetryAfter errors are honoured in held lanes too.
	delays := settler{retryDelay: cfg.RetryDelay}
	for i, m := range h.Handled {
		if err := h.Results[i]; err != nil {
			failed = append(failed, dbq.HeldFailure{ID: m.ID, RetryAfter: delays.delay(failure{msg: m, err: err}), Reason: reason(err)})
		} else {
			done = append(done, m.ID)
		}
	}
	for attempt := 0; ; attempt++ {
		sl.lanes.LockChunk()
		start := time.Now()
		ok, err := pc.client.queries.SettleHeldPartitioned(ctx, cfg.Queue, cfg.Consumer, lease.Slot, lease.NSlots, cfg.WorkerID, lease.Token,
			lease.Epoch, h.Key.arg(), h.Head.ID, done, failed)
		sl.lanes.UnlockChunk()
		if err == nil {
			lease.Renewed(start)
			if !ok {
				pc.client.logger.WarnContext(ctx, "pgque: hold of key was released by another owner; its events are handled again",
					slog.String("queue", cfg.Queue), slog.String("consumer", cfg.Consumer), slog.Int("slot", lease.Slot))
				return nil
			}
			if len(failed) > 0 {
				// The server settled the failures under its policy of the
				// moment; an operator may have switched it while the lane
				// ran, and Policy() must say what the next chunk gets.
				if now, perr := serverPolicy(ctx, pc.client.queries, cfg.Queue, cfg.Consumer); perr == nil {
					pc.policy.Store(int32(now))
				}
			}
			return nil
		}
		err = mapError(fmt.Sprintf("settling held key %v of slot %d", h.Key, lease.Slot), err)
		if errors.Is(err, ErrLeaseLost) || ctx.Err() != nil || attempt >= 4 {
			return fmt.Errorf("%w; giving the slot up so that its next owner releases the key: %w", err, ErrLeaseLost)
		}
		pc.client.logger.WarnContext(ctx, "pgque: settling held key", slog.Any("error", err))
		if !backoff.Sleep(ctx.Done(), backoff.Errors.Delay(attempt)) {
			return nil
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
	slots := make(map[int]*slotState, len(pc.lanes))
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

func (sl *slotState) stats(slot int) LaneStats {
	st := sl.lanes.Stats(func(m *Message) time.Time { return m.CreatedAt })
	return LaneStats{Slot: slot, HeldKeys: st.HeldKeys, Queued: st.Queued, OldestInFlight: st.Oldest}
}

// observeLanes updates the per-slot lane gauges (nil: the slot is gone).
func (pc *PartitionedConsumer) observeLanes(slot int, sl *slotState) {
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
