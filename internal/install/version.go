package install

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	if err := TrustSchema(ctx, q); err != nil {
		return "", err
	}
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

// trustQuery names what the calling role has that the owner of schema
// pgque lacks, among the rights that code running as the caller could
// turn against the cluster: NULL when nothing, when the schema is the
// caller's own or a superuser's, or when there is no schema pgque the
// caller may use. Only catalogs are read and every operator is
// pg_catalog's: nothing of another role runs. The TypeScript client's
// trustSchema asks the same.
const trustQuery = `select o.rolname, r.rolname,
	case
		when not pg_catalog.has_schema_privilege(n.oid, 'USAGE') or n.nspowner operator(pg_catalog.=) r.oid or o.rolsuper then null
		when r.rolsuper then 'SUPERUSER'
		when r.rolcreaterole and not o.rolcreaterole then 'CREATEROLE'
		when r.rolbypassrls and not o.rolbypassrls then 'BYPASSRLS'
		when r.rolreplication and not o.rolreplication then 'REPLICATION'
		else (select 'membership in ' operator(pg_catalog.||) pg_catalog.min(p.rolname::pg_catalog.text)
		        from pg_catalog.pg_roles p
		       where p.rolname operator(pg_catalog.=) any ('{pg_execute_server_program,pg_read_server_files,pg_write_server_files,pg_read_all_data,pg_write_all_data,pg_signal_backend}'::pg_catalog.name[])
		         and pg_catalog.pg_has_role(r.oid, p.oid, 'MEMBER') and not pg_catalog.pg_has_role(o.oid, p.oid, 'MEMBER'))
	end
	from pg_catalog.pg_namespace n, pg_catalog.pg_roles r, pg_catalog.pg_roles o
	where n.nspname operator(pg_catalog.=) 'pgque' and r.rolname operator(pg_catalog.=) current_user
	  and o.oid operator(pg_catalog.=) n.nspowner`

// TrustSchema fails with 42501 when schema pgque belongs to a role that
// lacks a right the caller has (superuser, CREATEROLE, BYPASSRLS,
// REPLICATION, or membership in a predefined role that reads or writes any
// data, the server's files or programs, or signals backends). Every
// function and table of schema pgque is its owner's code, run as the
// caller or, SECURITY DEFINER, able to change the caller's session (a
// search_path set with set_config outlives the call): calling into a
// schema that a less privileged role prepared would hand it those rights.
// So the clients ask before their first call into the schema, as the
// installer refuses a superuser's install over another role's schema. The
// owner's own login, or a superuser's session with options '-c
// role=<owner>', is trusted. A database without schema pgque, or whose
// schema the caller may not use, passes: nothing there can be called.
func TrustSchema(ctx context.Context, q Querier) error {
	var owner, caller string
	var lacks *string
	err := q.QueryRow(ctx, trustQuery).Scan(&owner, &caller, &lacks)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking the owner of schema pgque: %w", err)
	}
	if lacks == nil {
		return nil
	}
	// The server's own form of the refusal, so that every caller maps it as
	// it maps a 42501 from a pgque function.
	return &pgconn.PgError{
		Severity: "ERROR", Code: "42501",
		Message: fmt.Sprintf("schema pgque is owned by role %s, which lacks %s that role %s has: "+
			"pgque's clients run no code of a less privileged role's schema", owner, *lacks, caller),
		Hint: fmt.Sprintf("connect as %s (a superuser can add options='-c role=%s'), or install pgque as a role you trust", owner, owner),
	}
}
