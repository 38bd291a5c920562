package dbq

import (
	"context"
	"time"
)

// RotationBlocker is one row of rotation_blockers().
type RotationBlocker struct {
	// Queue is nil for a flip of the tick or state partitions.
	Queue *string
	Kind  string
	What  string
	// Since is nil when the server could not tell (another role's
	// session, without pg_read_all_stats).
	Since *time.Time
	// Pid, Role and Holds name a session; nil for the other kinds (and
	// Pid for a prepared transaction).
	Pid         *int32
	Role, Holds *string
}

// RotationBlockers reads rotation_blockers() (admin only).
func (q *Queries) RotationBlockers(ctx context.Context) ([]RotationBlocker, error) {
	rows, err := q.db.Query(ctx, `select queue, kind, what, since, pid, role, holds from pgque.rotation_blockers()`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []RotationBlocker
	for rows.Next() {
		var b RotationBlocker
		if err := rows.Scan(&b.Queue, &b.Kind, &b.What, &b.Since, &b.Pid, &b.Role, &b.Holds); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}
