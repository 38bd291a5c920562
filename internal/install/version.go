package install

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// InstalledVersion returns the pgque version installed in the database, or
// "" when pgque is not installed (no pgque.version table, or no row in it)
// or the caller may not use schema pgque (then it is not pgque's to read:
// Install's preflight refuses such a schema with a clear error).
// It calls pgque.version(), which every pgque role may execute, when that
// function exists, and reads the table (pgque_admin only) on installs that
// predate it.
func InstalledVersion(ctx context.Context, q Querier) (string, error) {
	var table, fn bool
	err := q.QueryRow(ctx, `select
		exists (select 1 from pg_catalog.pg_class c
		        join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		        where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
		          and pg_catalog.has_schema_privilege(n.oid, 'USAGE')),
		exists (select 1 from pg_catalog.pg_proc p
		        join pg_catalog.pg_namespace n on n.oid = p.pronamespace
		        where n.nspname operator(pg_catalog.=) 'pgque' and p.proname operator(pg_catalog.=) 'version'
		          and p.pronargs operator(pg_catalog.=) 0)`).Scan(&table, &fn)
	if err != nil {
		return "", fmt.Errorf("reading the installed pgque version: %w", err)
	}
	if !table {
		return "", nil
	}
	var v *string
	if fn {
		err = q.QueryRow(ctx, "select pgque.version()").Scan(&v)
	} else {
		err = q.QueryRow(ctx, "select version from pgque.version").Scan(&v)
	}
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && v == nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the installed pgque version: %w", err)
	}
	return *v, nil
}
