// Package dbq is pgque's data layer: the only place where the library calls
// the SQL functions and views of the contract in docs/sql-reference.md (the
// installer, internal/install, runs the embedded script and reads the
// catalog itself, and the tools under cmd/pgque have their own few
// statements). It has one method per SQL function or view, each a single
// statement, over DBTX, which
// *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy: the caller decides whether
// a call runs alone (its own short transaction, safe through a transaction
// pooler) or inside a transaction it owns.
//
// Errors are returned as pgx returns them (a *pgconn.PgError carries the
// SQLSTATE); mapping them to pgque's typed errors is the caller's job.
package dbq

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what every query needs: satisfied by *pgxpool.Pool, *pgx.Conn and
// pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Queries binds the SQL functions to one DBTX.
type Queries struct {
	db DBTX
}

// New returns the queries bound to db.
func New(db DBTX) *Queries {
	return &Queries{db: db}
}

// UndefinedFunction reports whether err is the server's 42883: a function
// this client calls is not installed (a server older than the client).
func UndefinedFunction(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42883"
}
