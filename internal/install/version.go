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
// predate it. Either only when it can run no code of another role as the
// caller: the function is the caller's own (the current_user's, not a
// role it is a member of: a superuser is a member of every role), or
// SECURITY DEFINER with a
// pinned search_path and owned by the schema's owner (so it runs as that
// owner, as pgque's does); the table is the caller's own, or a plain table
// without row security owned by the schema's owner. Anything else (a
// schema pgque someone prepared, as a trap for whoever looks) reads as "".
func InstalledVersion(ctx context.Context, q Querier) (string, error) {
	var table, fn bool
	err := q.QueryRow(ctx, `select
		exists (select 1 from pg_catalog.pg_class c
		        join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		        where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
		          and pg_catalog.has_schema_privilege(n.oid, 'USAGE')
		          and (c.relowner operator(pg_catalog.=) r.oid
		               or (c.relkind operator(pg_catalog.=) 'r' and not c.relrowsecurity
		                   and c.relowner operator(pg_catalog.=) n.nspowner
		                   and exists (select 1 from pg_catalog.pg_attribute a
		                               where a.attrelid operator(pg_catalog.=) c.oid and a.attname operator(pg_catalog.=) 'version'
		                                 and a.atttypid operator(pg_catalog.=) 'pg_catalog.text'::pg_catalog.regtype)))),
		exists (select 1 from pg_catalog.pg_proc p
		        join pg_catalog.pg_namespace n on n.oid = p.pronamespace
		        where n.nspname operator(pg_catalog.=) 'pgque' and p.proname operator(pg_catalog.=) 'version'
		          and p.pronargs operator(pg_catalog.=) 0
		          and (p.proowner operator(pg_catalog.=) r.oid
		               or (p.prosecdef and p.proowner operator(pg_catalog.=) n.nspowner
		                   and exists (select 1 from pg_catalog.unnest(p.proconfig) g
		                               where g operator(pg_catalog.~~) 'search\_path=%'))))
		from pg_catalog.pg_roles r where r.rolname operator(pg_catalog.=) current_user`).Scan(&table, &fn)
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

// ownVersion is InstalledVersion as the installer reads it, before the
// script's preflight has run: only when schema pgque, its version table
// and its version function all belong to the installing role. Otherwise
// it reads nothing and returns "": calling a function, or reading a table
// (a view, a column type's output function), of a schema another role
// prepared would run that role's code as the installer, and the
// preflight, the script's first statement, refuses such a schema with an
// error naming its owner.
func ownVersion(ctx context.Context, q Querier) (string, error) {
	var own bool
	err := q.QueryRow(ctx, `select coalesce(pg_catalog.bool_and(o.owner operator(pg_catalog.=) r.oid), true)
		from (select n.nspowner as owner from pg_catalog.pg_namespace n
		       where n.nspname operator(pg_catalog.=) 'pgque'
		      union all
		      select c.relowner from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
		       where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
		      union all
		      select p.proowner from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace
		       where n.nspname operator(pg_catalog.=) 'pgque' and p.proname operator(pg_catalog.=) 'version') o,
		     pg_catalog.pg_roles r
		where r.rolname operator(pg_catalog.=) current_user`).Scan(&own)
	if err != nil {
		return "", fmt.Errorf("reading the installed pgque version: %w", err)
	}
	if !own {
		return "", nil
	}
	return InstalledVersion(ctx, q)
}
