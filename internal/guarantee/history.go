// Package guarantee checks a recorded history of handler calls against
// the delivery guarantees of docs/design.md: no loss, G1 (per-key affinity
// and FIFO of first deliveries), G2 (one live processor per key; fenced
// zombies counted apart and bounded by the lease TTL) and G3 (pause:
// successes are exactly the key's ev_id sequence minus dead letters).
//
// It is pure Go and needs no database: Check takes a History. The chaos
// harness (cmd/pgque/internal/chaos) builds one from its processes'
// records after a run with injected faults; the library's own tests build
// one from the handler calls they record in process. One checker serves
// both, so a guarantee is defined once.
package guarantee

import (
	"time"
)

// Outcomes of a handler attempt.
const (
	// OutcomeOK: the handler body returned nil.
	OutcomeOK = "ok"
	// OutcomeError: an injected error was returned.
	OutcomeError = "error"
	// OutcomePanic: the handler panicked (injected).
	OutcomePanic = "panic"
	// OutcomeCancelled: the handler's context ended (lease lost, shutdown).
	OutcomeCancelled = "cancelled"
	// OutcomeSkipped: under pause, an earlier event of the key failed in the
	// same chunk, so the body did not run (the server defers the event).
	// A skipped record is not a handling.
	OutcomeSkipped = "skipped"
)

// Attempt is one handler invocation as the worker recorded it: a start
// record written before the handler body runs, and an end record after.
type Attempt struct {
	Proc    string    `json:"proc"`    // process incarnation id, also its lease worker id
	Slot    int       `json:"slot"`    // slot that delivered the event
	NSlots  int       `json:"nslots"`  // the N that slot belonged to (it changes with a resize)
	Epoch   int64     `json:"epoch"`   // lease epoch the event was received under
	Key     string    `json:"key"`     // partition key
	EvID    int64     `json:"ev_id"`   // event id
	Seq     int64     `json:"seq"`     // per-key sequence number from the payload
	Retry   int       `json:"retry"`   // retry_count at delivery
	Outcome string    `json:"outcome"` // one of the Outcome* constants; "" when no end was recorded
	Start   time.Time `json:"start"`
	// End is zero when the process died before recording the end; the
	// checker then ends the interval at the process's death.
	End time.Time `json:"end"`
}

// Committed is one event the queue holds: the truth for no-loss.
type Committed struct {
	Key  string `json:"key"`
	Seq  int64  `json:"seq"`
	EvID int64  `json:"ev_id"`
}

// DeadLetter is one dead-lettered event.
type DeadLetter struct {
	EvID     int64     `json:"ev_id"`
	Key      string    `json:"key"`
	Consumer string    `json:"consumer"`
	Time     time.Time `json:"time"`
}

// Fault kinds the scheduler injects (and the checker uses to explain
// redeliveries).
const (
	FaultWorkerKill    = "worker-kill"    // SIGKILL a worker, start a new one
	FaultWorkerStop    = "worker-stop"    // SIGSTOP a worker past the lease TTL, then SIGCONT
	FaultProducerKill  = "producer-kill"  // SIGKILL a producer, start a new one
	FaultTickerKill    = "ticker-kill"    // SIGKILL the ticker, start a new one
	FaultPGRestart     = "pg-restart"     // Postgres immediate shutdown + restart
	FaultResize        = "resize"         // resize_slots to another N while everything runs
	FaultPgBouncerKill = "pgbouncer-kill" // SIGKILL PgBouncer, start it again
	FaultHandlerError  = "handler-error"  // counted from attempts
	FaultHandlerPanic  = "handler-panic"  // counted from attempts
	FaultLeaseExpiry   = "lease-expiry"   // a fenced zombie was observed (counted from attempts)
	FaultShutdown      = "shutdown"       // orderly stop at the end of the run
	FaultProcessExit   = "process-exit"   // a process exited by itself (crash)
	// Observed in the workers' logs, not injected: the worker fenced a slot
	// itself (its local view of the lease expired, or a renewal found
	// another epoch), or a receive/ack/nack of a slot failed. Either way
	// the chunk in hand was not acknowledged and comes again, possibly
	// under the same epoch when the server still had the lease.
	FaultFence     = "fence"
	FaultWorkError = "work-error"
)

// Fault is one injected (or observed) fault. Target is a process id, or ""
// for cluster-wide faults (Postgres, PgBouncer).
type Fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target,omitempty"`
	Slot   *int      `json:"slot,omitempty"` // fence and work-error: the slot
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"` // when the fault was lifted (SIGCONT, restart done)
}

// Claim is a slot lease a worker was granted, as its log says. From At on
// every older epoch of the slot is fenced: a handler of one still running
// is a zombie's. A takeover that finds the slot's batch done hands out no
// event, so a claim is the only record that it superseded the epoch before.
type Claim struct {
	Proc   string    `json:"proc"`
	Slot   int       `json:"slot"`
	NSlots int       `json:"nslots"`
	Epoch  int64     `json:"epoch"`
	At     time.Time `json:"at"`
}

// History is everything the checker needs.
type History struct {
	// Policy is "pause" or "skip".
	Policy string
	// LeaseTTL is the slot lease TTL the workers ran with.
	LeaseTTL time.Duration
	// End is when the run ended; intervals with neither an end record nor a
	// known death end here.
	End time.Time

	// KeySlots is, when known, the slot each key must be delivered by
	// (pgque.slot_of(key, N)); G1 affinity is then checked against it.
	KeySlots map[string]int
	// KeySlotsByN is the same for every N the consumer had during the run
	// (a resize moves keys); attempts that record their N are checked
	// against it.
	KeySlotsByN map[int]map[string]int

	Attempts    []Attempt
	Committed   []Committed
	DeadLetters []DeadLetter
	Faults      []Fault
	// Claims are the leases granted during the run, when the workers log
	// them (Go workers do); without them a takeover is known from its
	// first handler run only.
	Claims []Claim

	// Tx is set when the handlers ran as HandlerTx, each writing one row
	// to chaos_effects in its transaction; Effects counts those rows per
	// ev_id at the end of the run.
	Tx      bool
	Effects map[int64]int
}
