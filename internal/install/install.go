package install

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	sqlfiles "github.com/pgque/pgque/sql"
)

// LockKey is the pg_advisory_xact_lock key that serializes the first
// Install of a database across sessions: the bytes of "pgque" read as a
// number. Any role may take an advisory lock, so it is waited for only a
// bounded time (FreshLockWait); once pgque is installed, installs lock
// pgque.version instead, which only its owner and pgque_admin can lock.
const LockKey int64 = 0x7067717565

// Querier runs a query; *pgx.Conn, *pgxpool.Pool, *pgxpool.Conn and pgx.Tx
// all satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Conn is a database handle that can open a transaction: *pgx.Conn,
// *pgxpool.Pool, *pgxpool.Conn, or a pgx.Tx (the work then runs in a
// savepoint and lands when the caller commits).
type Conn interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Result describes what Install did.
type Result struct {
	// Previous is the version that was installed before, "" on a fresh
	// database.
	Previous string
	// Version is the version installed now, read back from pgque.version.
	Version string
	// RoleAdmins lists, as "role on pgque_role", the roles other than the
	// installing one and superusers that hold ADMIN OPTION on a pgque role,
	// so that each may grant that role to any role, itself included. On
	// PostgreSQL 16 and later a CREATEROLE role holds it on every role it
	// created: one that created the pgque roles before the install (a DBA,
	// the owner of pgque in another database of the cluster, or a role
	// that should not have it) keeps that power. The install cannot tell
	// them apart; the operator can (docs/security.md).
	RoleAdmins []string
}

// Fresh reports whether Install created pgque rather than upgrading it.
func (r Result) Fresh() bool { return r.Previous == "" }

// Install installs pgque into the database conn is connected to, or upgrades
// it in place, in one transaction: either all of the script applies or none
// of it. Errors from the script name the SQL file and line when PostgreSQL
// reports a position, and keep the *pgconn.PgError for errors.As.
func Install(ctx context.Context, conn Conn) (Result, error) {
	script, err := sqlfiles.Script()
	if err != nil {
		return Result{}, fmt.Errorf("installing pgque: %w", err)
	}
	var res Result
	err = inTx(ctx, conn, func(tx pgx.Tx) error {
		if res.Previous, err = ownVersion(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, script); err != nil {
			return locate(script, err)
		}
		if res.Version, err = InstalledVersion(ctx, tx); err != nil {
			return err
		}
		if res.Version != sqlfiles.Version {
			return fmt.Errorf("the script recorded version %q, want %q", res.Version, sqlfiles.Version)
		}
		res.RoleAdmins, err = RoleAdmins(ctx, tx)
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("installing pgque: %w", err)
	}
	return res, nil
}

// inTx runs fn in a transaction that holds the installer's advisory lock,
// committing when fn succeeds and rolling back otherwise.
func inTx(ctx context.Context, conn Conn, fn func(pgx.Tx) error) (err error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
		}
	}()
	if err := lockInstall(ctx, tx); err != nil {
		return fmt.Errorf("taking the install lock: %w", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// FreshLockWait bounds how long the first Install of a database waits for
// the advisory lock before it goes on without it, and how long an upgrade
// waits for its lock on pgque.version before it fails.
const FreshLockWait = 10 * time.Second

// lockInstall serialises Install and Uninstall. On an installed database it
// takes a self-conflicting lock on pgque.version, which a role without a
// pgque grant cannot take or hold, waiting at most FreshLockWait: a pgque
// role can hold a lock on it without the right to (PREPARE of an UPDATE
// locks the table and runs nothing), so a longer wait fails with an error
// naming the sessions that hold it. On a fresh database it waits at most
// FreshLockWait for the advisory lock (another installer starting at the
// same moment finishes well within it) and then goes on without it: a
// stranger holding the key cannot stall the install, and at worst two first
// installs collide on the catalog and the loser fails cleanly, to be re-run
// as an upgrade.
func lockInstall(ctx context.Context, tx pgx.Tx) error {
	// Looked up in the catalog, not with to_regclass: a schema pgque that
	// someone else prepared may not even be readable, and the install
	// script's preflight explains that better than a lock error.
	var installed bool
	if err := tx.QueryRow(ctx, `select exists (
		select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
		 where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
		   and pg_catalog.has_schema_privilege(n.oid, 'USAGE')
		   and pg_catalog.has_table_privilege(c.oid, 'UPDATE'))`).Scan(&installed); err != nil {
		return err
	}
	if installed {
		got, err := lockWithin(ctx, tx, "lock table pgque.version in share row exclusive mode")
		if err != nil || got {
			return err
		}
		var holders string
		if err := tx.QueryRow(ctx, `select coalesce(pg_catalog.string_agg(distinct pg_catalog.format('pid %s (role %s)',
				l.pid, coalesce(a.usename::text, '?')), ', '), 'none now')
			  from pg_catalog.pg_locks l left join pg_catalog.pg_stat_activity a on a.pid operator(pg_catalog.=) l.pid
			 where l.granted and l.relation operator(pg_catalog.=) 'pgque.version'::pg_catalog.regclass
			   and l.pid operator(pg_catalog.<>) pg_catalog.pg_backend_pid()`).Scan(&holders); err != nil {
			return err
		}
		return fmt.Errorf("pgque.version stayed locked for %s by %s: another install or uninstall is running, "+
			"or a session holds a lock on it; retry when it ends", FreshLockWait, holders)
	}
	// Held by someone else for too long: go on without it.
	_, err := lockWithin(ctx, tx, fmt.Sprintf("select pg_catalog.pg_advisory_xact_lock(%d)", LockKey))
	return err
}

// lockWithin runs stmt, which takes a lock, waiting at most FreshLockWait,
// and reports whether it got the lock. The transaction's lock_timeout is
// left as it was.
func lockWithin(ctx context.Context, tx pgx.Tx, stmt string) (bool, error) {
	var prev string
	if err := tx.QueryRow(ctx, "select pg_catalog.current_setting('lock_timeout')").Scan(&prev); err != nil {
		return false, err
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, err
	}
	_, err = sp.Exec(ctx, "select pg_catalog.set_config('lock_timeout', $1, true)", fmt.Sprintf("%dms", FreshLockWait.Milliseconds()))
	if err == nil {
		_, err = sp.Exec(ctx, stmt)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		// Rolling back the savepoint also undoes the lock_timeout.
		return false, sp.Rollback(ctx)
	}
	if err != nil {
		return false, errors.Join(err, sp.Rollback(ctx))
	}
	// Releasing the savepoint keeps the lock and the lock_timeout: put the
	// caller's lock_timeout back.
	if err := sp.Commit(ctx); err != nil {
		return false, err
	}
	_, err = tx.Exec(ctx, "select pg_catalog.set_config('lock_timeout', $1, true)", prev)
	return err == nil, err
}

// ignoreClosed drops the error of rolling back a transaction that already
// ended (for example because the connection broke).
func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

// RoleAdmins returns what Result.RoleAdmins lists, for the role q runs as
// (pgque._role_admins(), which only the owner may call).
func RoleAdmins(ctx context.Context, q Querier) ([]string, error) {
	var admins []string
	if err := q.QueryRow(ctx, `select pgque._role_admins()`).Scan(&admins); err != nil {
		return nil, fmt.Errorf("listing the roles that may grant pgque's roles: %w", err)
	}
	return admins, nil
}
