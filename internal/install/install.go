package install

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	sqlfiles "github.com/pgque/pgque/sql"
)

// LockKey is the pg_advisory_xact_lock key that serializes Install and
// Uninstall across sessions: the bytes of "pgque" read as a number.
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
		if res.Previous, err = InstalledVersion(ctx, tx); err != nil {
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
		return nil
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
	if _, err := tx.Exec(ctx, "select pg_catalog.pg_advisory_xact_lock($1)", LockKey); err != nil {
		return fmt.Errorf("taking the install lock: %w", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// ignoreClosed drops the error of rolling back a transaction that already
// ended (for example because the connection broke).
func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}
