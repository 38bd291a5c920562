// Package pgquemigrate installs, upgrades and removes pgque's schema in a
// database, and reports which version is installed.
//
// The schema is the SQL embedded in the library (the same files
// `pgque sql` prints). Install applies all of it in one transaction under an
// advisory lock, so several application instances may call it at start-up:
// they run one after the other, and on a database that already has pgque the
// same call upgrades it in place, because every file is idempotent. A client
// built from one version of the library works with exactly that schema
// version: pgque.Connect and the services' Start methods fail with
// pgque.ErrSchemaVersion when the database holds another one, so the usual
// deployment runs Install (or `pgque upgrade`) before the new code starts.
//
// Install needs a role that may create the pgque schema (the database owner,
// say) and the pgque_reader, pgque_writer and pgque_admin roles, or finds
// those roles already created; it needs no superuser.
package pgquemigrate

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	sqlfiles "github.com/pgque/pgque/sql"
)

// Version is the schema version this library installs and expects.
const Version = sqlfiles.Version

// Roles are the roles the schema grants to, from the most to the least
// privileged.
var Roles = append([]string(nil), install.Roles...)

// Conn is a database handle that can open a transaction: *pgx.Conn,
// *pgxpool.Pool, *pgxpool.Conn, or a pgx.Tx (the work then runs in a
// savepoint and lands when the caller commits).
type Conn interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Querier runs a query: *pgx.Conn, *pgxpool.Pool, *pgxpool.Conn and pgx.Tx
// all satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Result describes what Install did.
type Result struct {
	// Previous is the version that was installed before, "" on a fresh
	// database.
	Previous string
	// Version is the version installed now.
	Version string
	// RoleAdmins lists, as "role on pgque_role", the roles other than the
	// installing one and superusers that hold ADMIN OPTION on a pgque role:
	// each may grant that role to any role, itself included. On
	// PostgreSQL 16 and later a CREATEROLE role holds it on every role it
	// created, so one that created the pgque roles before the install
	// keeps that power. Check that each is a role you trust (a DBA, the
	// owner of pgque in another database of the cluster); see
	// docs/security.md.
	RoleAdmins []string
}

// Fresh reports whether Install created pgque rather than upgrading it.
func (r Result) Fresh() bool { return r.Previous == "" }

// Install installs pgque into the database, or upgrades it in place, in one
// transaction: either all of the schema applies or none of it. An error from
// the SQL names the file and line and keeps the *pgconn.PgError for
// errors.As.
func Install(ctx context.Context, conn Conn) (Result, error) {
	res, err := install.Install(ctx, conn)
	return Result{Previous: res.Previous, Version: res.Version, RoleAdmins: res.RoleAdmins}, err
}

// Uninstall drops the pgque schema and everything in it, in one
// transaction. With dropRoles it also drops the pgque_* roles that no other
// object or grant still uses.
func Uninstall(ctx context.Context, conn Conn, dropRoles bool) error {
	return install.Uninstall(ctx, conn, dropRoles)
}

// InstalledVersion returns the schema version installed in the database,
// or "" when pgque is not installed or the caller may not use schema pgque.
// Every pgque role may call it. It fails as TrustSchema does first.
func InstalledVersion(ctx context.Context, q Querier) (string, error) {
	return install.InstalledVersion(ctx, q)
}

// TrustSchema fails with a 42501 error (a *pgconn.PgError naming the owner
// and what it lacks) when schema pgque belongs to a role that lacks a
// right the caller has: SUPERUSER, CREATEROLE, BYPASSRLS, REPLICATION, or
// membership in pg_execute_server_program, pg_read_server_files,
// pg_write_server_files, pg_read_all_data, pg_write_all_data or
// pg_signal_backend. The schema's functions are its owner's code, and
// calling them runs that code with the caller's rights (or, SECURITY
// DEFINER, lets it change the caller's session), so pgque's clients call
// nothing in such a schema: a superuser's client over a schema a lesser
// role prepared as a trap is refused before its first call. Connect as
// the owner instead (a superuser can add options='-c role=<owner>'). The
// Client, every service's Start, the CLI and InstalledVersion ask it.
func TrustSchema(ctx context.Context, q Querier) error {
	return install.TrustSchema(ctx, q)
}

// Script returns the whole install script as one text, for applying with
// psql -1 -f or a migration tool of one's own.
func Script() (string, error) { return sqlfiles.Script() }
