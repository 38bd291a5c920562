package dbq

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Listen runs LISTEN on channel; conn must be a dedicated session.
func (q *Queries) Listen(ctx context.Context, channel string) error {
	_, err := q.db.Exec(ctx, `listen `+pgx.Identifier{channel}.Sanitize())
	return err
}

// Notify calls pg_notify(channel, payload).
func (q *Queries) Notify(ctx context.Context, channel, payload string) error {
	_, err := q.db.Exec(ctx, `select pg_notify($1::text, $2::text)`, channel, payload)
	return err
}
