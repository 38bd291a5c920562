package pgque

import (
	"context"
	"fmt"
	"log/slog"
)

// Config configures a Client. The zero value is valid; a nil *Config means
// the zero value.
type Config struct {
	// Logger receives the client's logs (snake_case keys, the error under
	// "error"). Nil means slog.Default().
	Logger *slog.Logger

	// Observer receives the client's measurements and brackets its sends
	// and handler calls (see Observer; pgqueprom and pgqueotel implement
	// it). Nil means NopObserver.
	Observer Observer

	// OnError, when set, receives every error the client's background work
	// meets and survives: a consumer's or ticker's failed round (a dropped
	// queue, a permission error, a closed pool, a lost connection), which is
	// also logged and retried after a backoff. Database errors arrive as
	// *Error, so errors.Is(err, ErrQueueNotFound) and the like work; a
	// service that cannot recover can stop its consumers from here. It is
	// called on the failing goroutine and must return quickly.
	OnError func(ctx context.Context, err error)

	// PollOnly disables LISTEN/NOTIFY wake-ups, for connections through a
	// transaction-mode pooler (PgBouncer) where a LISTEN session cannot be
	// held. Consumers then rely on their poll interval alone, and the worker
	// pools of a partitioned consumer cannot hear each other's announcements,
	// so they spread only over free slots (see docs/worker-pool.md).
	// Without it, each LISTEN session is sent a notification through the
	// pool once it listens, and the Logger gets a warning when that does
	// not arrive within 3 s of its commit: the sign of such a pooler.
	PollOnly bool

	// SendConcurrency bounds the statements Client.Send keeps running at
	// once. Sends that arrive while that many run wait, and go out
	// together in one send_batch call per queue and type when one
	// finishes (see Send): under load, single sends then cost the server
	// about what batched ones do. Zero means 4. A negative value turns
	// this off: every Send runs its own statement at once, as SendTx does.
	// SendTx, SendBatch and SendBatchTx are never coalesced. With
	// coalescing on, Sends to one queue also run at most half the pool's
	// MaxConns statements at once, and Sends of one dedup key one, so
	// that a queue or key stuck on a lock leaves the rest of the pool to
	// other queues.
	SendConcurrency int
}

// withDefaults returns a copy of c with defaults filled in.
func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	if out.Observer == nil {
		out.Observer = NopObserver{}
	}
	return out
}

// validate reports the first invalid field. Config has none today; the
// method keeps the shape every config in this package shares.
func (c *Config) validate() error {
	return nil
}

// invalidConfig builds the error every validate returns.
func invalidConfig(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}
