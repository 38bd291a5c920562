package install

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// InstalledVersion returns the pgque version installed in the database, or
// "" when pgque is not installed (no pgque.version table, or no row in it).
func InstalledVersion(ctx context.Context, q Querier) (string, error) {
	var exists bool
	err := q.QueryRow(ctx, `select exists (
		select 1 from pg_catalog.pg_class c
		join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		where n.nspname = 'pgque' and c.relname = 'version')`).Scan(&exists)
	if err != nil {
		return "", fmt.Errorf("reading the installed pgque version: %w", err)
	}
	if !exists {
		return "", nil
	}
	var v string
	err = q.QueryRow(ctx, "select version from pgque.version").Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the installed pgque version: %w", err)
	}
	return v, nil
}
