// Package chaos is pgque's fault-injection harness: a runner that drives
// producer, worker and ticker processes against a real PostgreSQL while a
// fault scheduler kills, freezes and restarts them (and Postgres and
// PgBouncer under them), and a checker that verifies the recorded history
// against the guarantees of DESIGN.md: no loss, G1 (per-key affinity and
// FIFO of first deliveries), G2 (one live processor per key; fenced zombies
// counted apart and bounded by the lease TTL) and G3 (pause: successes are
// exactly the key's ev_id sequence minus dead letters).
//
// The checker is package guarantee of the root module (the library's tests
// use it too); this file names its types for the harness. The runner builds the History from append-only JSON-lines files that
// each process writes outside any handler transaction, plus the queue's own
// truth for what was committed (the chaos_sent table, written in the same
// transaction as each send) and the dead-letter table.
package chaos

import "github.com/pgque/pgque/internal/guarantee"

// The history the checker takes and its parts (see package guarantee).
type (
	Attempt    = guarantee.Attempt
	Claim      = guarantee.Claim
	Committed  = guarantee.Committed
	DeadLetter = guarantee.DeadLetter
	Fault      = guarantee.Fault
	History    = guarantee.History
	Report     = guarantee.Report
	Violation  = guarantee.Violation
)

// Outcomes of a handler attempt.
const (
	OutcomeOK        = guarantee.OutcomeOK
	OutcomeError     = guarantee.OutcomeError
	OutcomePanic     = guarantee.OutcomePanic
	OutcomeCancelled = guarantee.OutcomeCancelled
	OutcomeSkipped   = guarantee.OutcomeSkipped
)

// Fault kinds.
const (
	FaultWorkerKill    = guarantee.FaultWorkerKill
	FaultWorkerStop    = guarantee.FaultWorkerStop
	FaultProducerKill  = guarantee.FaultProducerKill
	FaultTickerKill    = guarantee.FaultTickerKill
	FaultPGRestart     = guarantee.FaultPGRestart
	FaultResize        = guarantee.FaultResize
	FaultPgBouncerKill = guarantee.FaultPgBouncerKill
	FaultHandlerError  = guarantee.FaultHandlerError
	FaultHandlerPanic  = guarantee.FaultHandlerPanic
	FaultLeaseExpiry   = guarantee.FaultLeaseExpiry
	FaultShutdown      = guarantee.FaultShutdown
	FaultProcessExit   = guarantee.FaultProcessExit
	FaultFence         = guarantee.FaultFence
	FaultWorkError     = guarantee.FaultWorkError
)

// Guarantee labels of violations.
const (
	GNoLoss          = guarantee.GNoLoss
	GG1              = guarantee.GG1
	GG2              = guarantee.GG2
	GG3              = guarantee.GG3
	GPhantom         = guarantee.GPhantom
	GuaranteeEffects = guarantee.GuaranteeEffects
)

// Check verifies h against the guarantees and returns the report.
func Check(h *History) *Report { return guarantee.Check(h) }
