package pgque

import (
	"context"
	"time"
)

// Kinds of RotationBlocker.
const (
	// BlockerSubscription: a subscription whose cursor still needs an event
	// of the queue's oldest table. Remedy: let it consume, or unsubscribe
	// it.
	BlockerSubscription = "subscription"
	// BlockerSession: a session holding a lock on the queue's oldest table
	// or on its row, usually a transaction left open. Remedy: end it
	// (pg_terminate_backend(PID)).
	BlockerSession = "session"
	// BlockerFlip: a session holding a lock on the current tick or state
	// partition, which keeps maint() from reclaiming them. Same remedy.
	BlockerFlip = "flip"
	// BlockerRetention: a layer keeps the oldest table a while longer
	// (dedup keys within their window); it passes by itself.
	BlockerRetention = "retention"
)

// RotationBlocker is one thing keeping maint() from rotating a queue's
// event tables or from reclaiming the tick and state partitions, as
// rotation_blockers() reports it. See docs/operations.md.
type RotationBlocker struct {
	// Queue is "" for a flip, which concerns every queue.
	Queue string
	// Kind is one of the Blocker* constants.
	Kind string
	// What names the blocker: the subscription, or the session's pid,
	// role, application and state.
	What string
	// Since is when the blocker began: the subscription's cursor time, the
	// start of the session's transaction, or when a retained table stopped
	// being written. Zero when unknown: the pgque owner sees another role's
	// transaction start only as a member of pg_read_all_stats.
	Since time.Time
	// PID, Role and Holds describe a session (0 and "" otherwise): its
	// backend process id, its login role, and the lock it holds on which
	// table.
	PID   int
	Role  string
	Holds string
}

// RotationBlockers returns what keeps due rotations and flips from
// happening (nothing when all is well). Admin only: other roles get
// ErrPermissionDenied.
func (c *Client) RotationBlockers(ctx context.Context) ([]RotationBlocker, error) {
	rows, err := c.queries.RotationBlockers(ctx)
	if err != nil {
		return nil, mapError("reading rotation blockers", err)
	}
	out := make([]RotationBlocker, len(rows))
	for i, r := range rows {
		out[i] = RotationBlocker{Queue: deref(r.Queue), Kind: r.Kind, What: r.What, Role: deref(r.Role), Holds: deref(r.Holds)}
		if r.Since != nil {
			out[i].Since = *r.Since
		}
		if r.Pid != nil {
			out[i].PID = int(*r.Pid)
		}
	}
	return out, nil
}
