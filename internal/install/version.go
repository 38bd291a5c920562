package install

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	sqlfiles "github.com/pgque/pgque/sql"
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
	err := q.QueryRow(ctx, sqlfiles.ClientQuery("version_source")).Scan(&table, &fn)
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
	err := q.QueryRow(ctx, sqlfiles.ClientQuery("own_version")).Scan(&own)
	if err != nil {
		return "", fmt.Errorf("reading the installed pgque version: %w", err)
	}
	if !own {
		return "", nil
	}
	return InstalledVersion(ctx, q)
}

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
// schema the caller may not use, passes: nothing there can be called. The
// query is sql/client/trust_schema.sql, which the TypeScript client runs
// too.
func TrustSchema(ctx context.Context, q Querier) error {
	var owner, caller string
	var lacks *string
	err := q.QueryRow(ctx, sqlfiles.ClientQuery("trust_schema")).Scan(&owner, &caller, &lacks)
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
