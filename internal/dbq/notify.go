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
	_, err := q.db.Exec(ctx, `select pg_catalog.pg_notify($1::pg_catalog.text, $2::pg_catalog.text)`, channel, payload)
	return err
}
