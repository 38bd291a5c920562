package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
)

// Tail defaults.
const (
	// tailChunk is the most events tail receives at once.
	tailChunk = 100
	// tailSlotTTL is the lease tail holds on a slot; every receive renews
	// it.
	tailSlotTTL = 30 * time.Second
	// cleanupTimeout bounds the clean-up tail does after an interrupt
	// (ack, release, unsubscribe).
	cleanupTimeout = 5 * time.Second
)

// tailOptions are tail's flags.
type tailOptions struct {
	queue    string
	consumer string
	slotArg  string
	slot     int
	nslots   int
	worker   string
	fromNow  bool
	asJSON   bool
	noAck    bool
	max      int
	timeout  time.Duration
	poll     time.Duration
	// invoked is when the command started, by the local clock.
	invoked time.Time
}

func (a *app) tailCommand() *cobra.Command {
	var o tailOptions
	cmd := &cobra.Command{
		Use:   "tail <queue>",
		Short: "Print events as they arrive, like a console consumer",
		Long: `Tail prints events as they arrive, one per line (ev_id, time, type, key,
payload), or as JSON lines with --json, until interrupted.

By default it creates a temporary subscription (tail.<random>), which starts
at the queue's latest tick and is removed when tail exits. --consumer reads an
existing subscription instead, continuing from its cursor; with --slot k/N it
reads slot k of that partitioned consumer through a lease held as --worker
(the slot must not be held by another live worker), released at exit.

Tail acknowledges what it printed, so a --consumer or --slot read consumes
those events. --no-ack looks without consuming: tail then works inside one
transaction that it rolls back at exit, leaving the subscription or slot
exactly as it was (while tail runs, other readers of that subscription or
slot wait for it; keep such sessions short).

--from-now skips (without printing) events sent before tail started, for
--consumer and --slot reads that have a backlog. --max N exits after N events
and --timeout after a duration.`,
		Args: exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.invoked = time.Now()
			o.queue = args[0]
			if err := o.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			return a.runTail(ctx, s, &o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.consumer, "consumer", "", "read this existing subscription (default: a temporary one)")
	f.StringVar(&o.slotArg, "slot", "", "read slot k/N of the partitioned consumer given by --consumer")
	f.StringVar(&o.worker, "worker", "", "worker id for the slot lease (default tail.<host>-<pid>-<random>)")
	f.BoolVar(&o.fromNow, "from-now", false, "skip events sent before tail started")
	f.BoolVar(&o.asJSON, "json", false, "print one JSON object per event")
	f.BoolVar(&o.noAck, "no-ack", false, "do not consume: roll everything back at exit")
	f.IntVar(&o.max, "max", 0, "exit after printing this many events (0: no limit)")
	f.DurationVar(&o.timeout, "timeout", 0, "exit after this long (0: no limit)")
	f.DurationVar(&o.poll, "poll", 100*time.Millisecond, "how often to look for new events when idle")
	return cmd
}

// validate checks the flags and parses --slot.
func (o *tailOptions) validate() error {
	switch {
	case o.max < 0:
		return usagef("--max must not be negative")
	case o.timeout < 0:
		return usagef("--timeout must not be negative")
	case o.poll <= 0:
		return usagef("--poll must be positive")
	case o.worker != "" && o.slotArg == "":
		return usagef("--worker needs --slot")
	}
	if o.slotArg == "" {
		return nil
	}
	if o.consumer == "" {
		return usagef("--slot needs --consumer (the partitioned consumer whose slot to read)")
	}
	k, n, ok := strings.Cut(o.slotArg, "/")
	slot, err1 := strconv.Atoi(k)
	nslots, err2 := strconv.Atoi(n)
	if !ok || err1 != nil || err2 != nil || nslots < 1 || slot < 0 || slot >= nslots {
		return usagef("--slot %q: want k/N with 0 <= k < N, e.g. --slot 3/8", o.slotArg)
	}
	o.slot, o.nslots = slot, nslots
	if o.worker == "" {
		o.worker = "tail." + defaultWorkerID()
	}
	return nil
}

// tailer reads one subscription or slot through a Receiver (over the pool,
// or in the transaction of a --no-ack run).
type tailer struct {
	o     *tailOptions
	r     *pgque.Receiver
	start time.Time
	// lease is the slot's lease when tailing a slot.
	lease pgque.SlotLease
}

// runTail sets up the subscription or slot, runs the loop and cleans up.
func (a *app) runTail(ctx context.Context, s *session, o *tailOptions) (err error) {
	t := &tailer{o: o, r: s.Receiver(nil)}
	if o.fromNow {
		// Events carry the server's time: translate the moment tail was
		// invoked to the server's clock, so clock skew does not matter.
		var now time.Time
		if err := s.pool.QueryRow(ctx, `select clock_timestamp()`).Scan(&now); err != nil {
			return fmt.Errorf("reading the server's clock: %w", err)
		}
		t.start = now.Add(-time.Since(o.invoked))
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	if o.noAck {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("starting the --no-ack transaction: %w", err)
		}
		// Everything tail did (subscribe, claim, acks) is undone.
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		t.r = s.Receiver(tx)
	}
	if err := checkTailConsumer(ctx, s, o); err != nil {
		return err
	}
	cleanup := context.WithoutCancel(ctx)
	switch {
	case o.consumer == "":
		o.consumer = "tail." + randomHex(4)
		if _, err := t.r.Subscribe(ctx, o.queue, o.consumer); err != nil {
			return err
		}
		if !o.noAck {
			defer func() {
				cctx, cancel := context.WithTimeout(cleanup, cleanupTimeout)
				defer cancel()
				if _, uerr := t.r.Unsubscribe(cctx, o.queue, o.consumer); uerr != nil {
					err = errors.Join(err, fmt.Errorf("removing the temporary subscription %s (remove it with 'pgque unsubscribe %s --consumer %s'): %w", o.consumer, o.queue, o.consumer, uerr))
				}
			}()
		}
	case o.nslots > 0:
		lease, ok, err := t.r.ClaimSlot(ctx, o.queue, o.consumer, o.slot, o.worker, tailSlotTTL)
		if err != nil {
			return err
		}
		t.lease = lease
		if !ok {
			return fmt.Errorf("slot %d/%d of consumer %q on queue %q is held by another live worker (see 'pgque slots status %s')", o.slot, o.nslots, o.consumer, o.queue, o.queue)
		}
		if !o.noAck {
			defer func() {
				cctx, cancel := context.WithTimeout(cleanup, cleanupTimeout)
				defer cancel()
				if _, rerr := t.r.ReleaseSlot(cctx, t.lease); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}()
		}
	}
	return t.loop(ctx, a)
}

// checkTailConsumer refuses, before anything is claimed, a --consumer that
// is a partitioned consumer read without --slot, and a --slot k/N whose N
// is not the consumer's: the errors the server would give (not subscribed,
// or a slot held by someone else when the wrong slot is busy) do not say
// what is wrong.
func checkTailConsumer(ctx context.Context, s *session, o *tailOptions) error {
	if o.consumer == "" {
		return nil
	}
	slots, err := s.Slots(ctx, o.queue, o.consumer)
	if err != nil || len(slots) == 0 {
		return nil // not partitioned, or not readable: the receive says why
	}
	n := slots[0].NSlots
	switch {
	case o.nslots == 0:
		return fmt.Errorf("consumer %q of queue %q is a partitioned consumer with %d slots: read one slot with --slot k/%d", o.consumer, o.queue, n, n)
	case o.nslots != n:
		return fmt.Errorf("--slot %s: consumer %q of queue %q has %d slots, not %d (--slot k/%d)", o.slotArg, o.consumer, o.queue, n, o.nslots, n)
	}
	return nil
}

// loop receives, prints and acknowledges until ctx ends or --max is
// reached.
func (t *tailer) loop(ctx context.Context, a *app) error {
	o := t.o
	printed := 0
	for {
		n := tailChunk
		if o.max > 0 {
			n = min(n, o.max-printed)
		}
		rows, err := t.receive(ctx, n)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			if !sleepCtx(ctx, o.poll) {
				return nil
			}
			continue
		}
		for _, r := range rows {
			if o.fromNow && r.CreatedAt.Before(t.start) {
				continue
			}
			if err := t.print(a, r); err != nil {
				return err
			}
			printed++
		}
		// Ack what was printed even when interrupted meanwhile.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		err = t.ack(actx, rows[0])
		cancel()
		if err != nil {
			return err
		}
		if o.max > 0 && printed >= o.max {
			return nil
		}
	}
}

func (t *tailer) receive(ctx context.Context, n int) ([]*pgque.Message, error) {
	o := t.o
	if o.nslots > 0 {
		return t.r.ReceiveSlot(ctx, t.lease, o.nslots, n)
	}
	return t.r.Receive(ctx, o.queue, o.consumer, n)
}

// ack acknowledges the chunk whose first message is m.
func (t *tailer) ack(ctx context.Context, m *pgque.Message) error {
	o := t.o
	if o.nslots > 0 {
		_, err := t.r.AckSlot(ctx, t.lease, o.nslots, m)
		return err
	}
	_, err := t.r.Ack(ctx, m.BatchID)
	return err
}

// tailEvent is one event as tail --json prints it.
type tailEvent struct {
	EvID       int64           `json:"ev_id"`
	Type       string          `json:"type"`
	Key        *string         `json:"key"`
	Payload    json.RawMessage `json:"payload"`
	RetryCount int             `json:"retry_count"`
	// Replay marks a replayed dead letter (absent otherwise).
	Replay    bool      `json:"replay,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	BatchID   int64     `json:"batch_id"`
	Slot      *int      `json:"slot,omitempty"`
}

func (t *tailer) print(a *app, r *pgque.Message) error {
	if t.o.asJSON {
		ev := tailEvent{EvID: r.ID, Type: r.Type, Key: keyArgOf(r.Key()), Payload: r.Payload,
			RetryCount: r.RetryCount, Replay: r.Replay, CreatedAt: r.CreatedAt, BatchID: r.BatchID}
		if t.o.nslots > 0 {
			ev.Slot = &t.o.slot
		}
		return a.printJSONLine(ev)
	}
	key := "-"
	if k, ok := r.Key().Value(); ok {
		key = k
	}
	retry := ""
	if r.RetryCount > 0 {
		retry = fmt.Sprintf(" (retry %d)", r.RetryCount)
	}
	if r.Replay {
		retry += " (replay)"
	}
	_, err := fmt.Fprintf(a.stdout, "%d\t%s\t%s\t%s\t%s%s\n", r.ID, r.CreatedAt.Format("2006-01-02T15:04:05.000Z07:00"),
		r.Type, key, r.Payload, retry)
	return err
}

// sleepCtx sleeps for d; it reports false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sanitizeName keeps the characters pgque accepts in names.
func sanitizeName(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "host"
	}
	return b.String()
}
