// Package pgque is an ordered, immutable event log inside PostgreSQL with
// partition keys: events that share a key are consumed in order by one
// worker at a time, events with different keys in parallel. This package is
// the Go API; the engine is plain SQL installed into the database (see
// docs/sql-reference.md and the pgque command).
//
// # Concepts
//
// A queue is an append-only log of events. Each event has an id (ev_id,
// the order within the queue), a type, a JSON payload and an optional
// partition key. Producers send events with Client.Send, or with
// Client.SendTx inside their own transaction, so that an event exists
// exactly when the transaction that produced it commits. SendBatch and
// SendBatchTx send many at once, atomically and in order.
//
// Events become visible to consumers in batches cut by ticks. Some process
// must therefore run a Ticker; any number may run, one leads (they elect a
// leader through a lease in the database), and with the default settings
// new events are ticked within tens of milliseconds. Each tick sends a
// NOTIFY that wakes consumers at once; consumers also poll, so a lost
// notification costs latency, never progress.
//
// A Consumer reads one subscription: all events, in ev_id order, by one
// goroutine. It receives a chunk, calls the handler on each message, nacks
// the failures (they come back after a backoff, up to the queue's
// max_retries, then go to the dead-letter table) and acks the chunk. A
// handler that panics is recovered and its message nacked.
//
// A PartitionedConsumer is a pool of workers over N slots. An event of key
// K belongs to slot hash(K) mod N (the NULL key to slot 0); each slot is a
// subscription of its own, with its own cursor. A worker works a slot only
// while it holds the slot's lease, and the server refuses receive and ack
// from anyone else, so at most one worker holds an unacked event of any key
// at any time (G2), and within a slot a key's events arrive in ev_id order
// (G1). Any number of processes share the N slots with no configuration:
// each claims up to its fair share, takes over the slots of crashed workers
// after the lease TTL, and gives slots up to newcomers at a chunk boundary.
// The lease's epoch reaches the handler as Message.Epoch, a fencing token
// for side effects. The algorithm is described in docs/worker-pool.md.
//
// Delivery is at least once: after a crash or a hard stop, the chunk in
// flight is delivered again to the next owner.
//
// # Failures
//
// A handler that returns an error or panics fails its event, which is
// retried after RetryDelay, up to the queue's max_retries, and then
// dead-lettered. What happens meanwhile to the key's later events is the
// consumer's FailurePolicy (G3), persisted per queue and consumer. With
// FailurePolicySkip (the default) they go on and may overtake the failed
// one. With FailurePolicyPause the key is blocked on its slot: the pool
// does not handle the chunk's later events of the key, the server holds
// back every later event of it, and other keys go on; once the failed event
// succeeds on a retry or is dead-lettered, the held events are delivered in
// ev_id order, each once, with RetryCount untouched. Events sent without a
// key share the NULL key (Message.Key, KeyRef). Client.BlockedKeys lists
// blocked keys; Client.RetryKeyNow and Client.UnblockKey act on them, and
// Client.SetFailurePolicy changes the policy.
//
// # Lifecycle
//
// Consumers, partitioned consumers and tickers share one shape: Start
// returns at once; Stop(ctx) stops fetching, lets the work in flight finish
// and be acknowledged, releases leases, and returns when every goroutine is
// gone. If ctx expires first, the work in flight is abandoned (handlers'
// contexts are cancelled, nothing more is acked) and Stop still waits for
// the goroutines. Cancelling the context given to Start is a hard stop, like
// a crash.
//
// # Errors
//
// Errors raised by the SQL are *Error values carrying the SQLSTATE; they
// unwrap to one of the sentinel errors (ErrQueueNotFound, ErrLeaseLost, …),
// chosen by SQLSTATE, and to the driver's *pgconn.PgError. Test them with
// errors.Is and errors.As.
//
// # Observability
//
// Logs go to the *slog.Logger in Config. Measurements go to the Observer in
// Config: events sent, processed, failed, retried and dead-lettered; batch
// and handler latency; per-slot lag and head age; lease claims, renewals,
// takeovers and fencings; ticker leadership. The Observer also brackets
// every send and handler call, for tracing. The library depends on no
// metrics package: module github.com/pgque/pgque/pgqueprom exports the
// measurements as Prometheus metrics (the same names as before), and
// github.com/pgque/pgque/pgqueotel records OpenTelemetry spans and metrics.
package pgque
