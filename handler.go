package pgque

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/metrics"
)

// HandlerFunc processes one message. Returning nil acknowledges it (with
// the rest of its chunk); returning an error, or panicking, nacks it: it is
// redelivered after the consumer's RetryDelay, or dead-lettered once the
// queue's max_retries is reached — or at once when the error is made by
// DeadLetter. With a HandlerTimeout, ctx also ends after that long (cause
// ErrHandlerTimeout). ctx is cancelled when the work must be
// abandoned: a hard Stop, or — for a partitioned consumer — the slot's lease
// was lost (context.Cause(ctx) is then ErrLeaseLost).
type HandlerFunc func(ctx context.Context, m *Message) error

// RetryDelayDefault is the default backoff before a failed event is
// redelivered: 1 s doubled per retry, capped at 10 min, ±10% jitter.
func RetryDelayDefault(retryCount int) time.Duration {
	return backoff.Policy{Base: time.Second, Max: 10 * time.Minute, Jitter: 0.1}.Delay(retryCount)
}

// DeadLetter wraps err so that returning it from a handler dead-letters the
// event at once, with err as the reason, instead of scheduling a retry: for
// failures that no retry can fix (a malformed payload, a deleted tenant).
// Under FailurePolicyPause the key's held events are then released, as after
// any dead letter. The result matches errors.Is(err, ErrDeadLetter) and
// unwraps to err. DeadLetter(nil) is a dead letter with a generic reason.
func DeadLetter(err error) error {
	if err == nil {
		err = errors.New("dead-lettered by the handler")
	}
	return &deadLetterError{err: err}
}

type deadLetterError struct{ err error }

func (e *deadLetterError) Error() string { return e.err.Error() }

func (e *deadLetterError) Unwrap() []error { return []error{ErrDeadLetter, e.err} }

// failure is a message whose handler failed.
type failure struct {
	msg *Message
	err error
}

// invoker calls a handler with panic recovery, logging and metrics.
type invoker struct {
	handler  HandlerFunc
	queue    string
	consumer string
	logger   *slog.Logger
	metrics  *metrics.Metrics
	observer Observer
	// timeout bounds each call (0: none).
	timeout time.Duration
	// inFlight, when set, tracks the handler calls in progress, so that a
	// Stop that gives up can say which handlers ignore their context.
	inFlight *inFlight
}

// inFlight is the set of handler calls in progress. Every event's call
// enters and leaves it, and it is read only when a Stop gives up, so the
// calls live in a slab of reused entries (no map insert and delete per
// event) that list sorts when asked.
type inFlight struct {
	mu    sync.Mutex
	seq   uint64
	calls []inFlightCall
	free  []int // indexes of calls not in use
}

// inFlightCall is one entry of the slab, a call in progress when seq is
// not 0. It copies the fields list names (the handler may change its
// Message) and not their text, made only when a Stop gives up.
type inFlightCall struct {
	seq             uint64
	id              int64
	queue, consumer string
	slot            int
	start           time.Time
}

// begin records a call and returns its entry for end.
func (f *inFlight) begin(m *Message, start time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	c := inFlightCall{seq: f.seq, id: m.ID, queue: m.Queue, consumer: m.Consumer, slot: m.Slot, start: start}
	if n := len(f.free); n > 0 {
		i := f.free[n-1]
		f.free = f.free[:n-1]
		f.calls[i] = c
		return i
	}
	f.calls = append(f.calls, c)
	return len(f.calls) - 1
}

func (f *inFlight) end(i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[i] = inFlightCall{}
	f.free = append(f.free, i)
}

// list names the calls in progress, oldest first.
func (f *inFlight) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var live []inFlightCall
	for _, c := range f.calls {
		if c.seq != 0 {
			live = append(live, c)
		}
	}
	slices.SortFunc(live, func(a, b inFlightCall) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]string, len(live))
	for i, c := range live {
		out[i] = fmt.Sprintf("handler of event %d (queue %s, consumer %s, slot %d) since %s",
			c.id, c.queue, c.consumer, c.slot, c.start.Format(time.RFC3339Nano))
	}
	return out
}

// chunkRun is what handleChunk did with a chunk.
type chunkRun struct {
	failures []failure
	// held counts the events of failed keys not handled (pause).
	held int
	// rest are the events not started when the slot was given up, but
	// the held ones, in chunk order.
	rest []*Message
	// aborted: ctx ended; the chunk must not be settled.
	aborted bool
}

// handleChunk runs the handler on each message in order and returns the
// failures. With holdKeys (the pause policy), once the handler failed on an
// event of a key, the chunk's later events of that key are not handled:
// nacking the failure defers them on the server. When giveUp closes (the
// slot is given up gracefully), it starts no other event and returns the
// rest, for the caller to hand back. It stops early, reporting aborted,
// when ctx ends: the chunk must then not be acked.
func (iv *invoker) handleChunk(ctx context.Context, msgs []*Message, holdKeys bool, giveUp <-chan struct{}) (r chunkRun) {
	var failed map[KeyRef]bool // keys failed in this chunk (holdKeys only)
	for i, m := range msgs {
		if ctx.Err() != nil {
			r.aborted = true
			return r
		}
		select {
		case <-giveUp:
			for _, m := range msgs[i:] {
				if failed[m.Key()] {
					r.held++
				} else {
					r.rest = append(r.rest, m)
				}
			}
			return r
		default:
		}
		if failed[m.Key()] {
			r.held++
			continue
		}
		if err := iv.call(ctx, m); err != nil {
			if ctx.Err() != nil {
				r.aborted = true
				return r
			}
			r.failures = append(r.failures, failure{msg: m, err: err})
			if holdKeys {
				if failed == nil {
					failed = make(map[KeyRef]bool)
				}
				failed[m.Key()] = true
			}
		}
	}
	r.aborted = ctx.Err() != nil
	return r
}

// call runs the handler once; a panic becomes an error wrapping
// ErrHandlerPanic.
func (iv *invoker) call(ctx context.Context, m *Message) (err error) {
	obs := iv.observer
	if obs == nil {
		obs = NopObserver{}
	}
	ctx = obs.HandleStart(ctx, m)
	if iv.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, iv.timeout, ErrHandlerTimeout)
		defer cancel()
	}
	start := time.Now()
	if iv.inFlight != nil {
		defer iv.inFlight.end(iv.inFlight.begin(m, start))
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w: %v", ErrHandlerPanic, v)
			iv.logger.ErrorContext(ctx, "pgque: handler panicked",
				slog.String("queue", iv.queue), slog.String("consumer", iv.consumer),
				slog.Int64("msg_id", m.ID), slog.Any("error", err), slog.String("stack", string(debug.Stack())))
		}
		if err != nil && iv.timeout > 0 && errors.Is(context.Cause(ctx), ErrHandlerTimeout) && !errors.Is(err, ErrHandlerTimeout) {
			err = fmt.Errorf("%w after %v: %w", ErrHandlerTimeout, iv.timeout, err)
		}
		took := time.Since(start)
		obs.HandleEnd(ctx, m, HandleResult{Err: err, Duration: took})
		iv.metrics.HandlerDuration.WithLabelValues(iv.queue, iv.consumer).Observe(took.Seconds())
		if err != nil {
			iv.metrics.Failed.WithLabelValues(iv.queue, iv.consumer).Inc()
		} else {
			iv.metrics.Processed.WithLabelValues(iv.queue, iv.consumer).Inc()
		}
	}()
	return iv.handler(ctx, m)
}

// reason is the text stored with a nack: the error's text made storable
// (valid UTF-8, no NUL) and bounded to ReasonMaxBytes on a rune boundary.
func reason(err error) string {
	return sanitizeReason(err.Error())
}
