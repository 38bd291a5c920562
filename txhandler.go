package pgque

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/dbq"
)

// HandlerTxFunc processes one message inside a transaction on the
// consumer's database (READ COMMITTED, begun on the Client's pool). What it
// writes through tx commits together with the record that marks the event
// done for its consumer, so each event's writes are applied exactly once
// per consumer, across crashes, lease takeovers, restarts and retries.
// Returning an error, or panicking, rolls tx back (no writes, no record)
// and then nacks the event as a HandlerFunc's error does (RetryAfter and
// DeadLetter work the same). It must not commit or roll tx back itself.
// When only the completion failed, waiting out its lock timeout, the
// transaction is run again at once (up to three times) rather than nacked.
//
// After a crash between the commit and the chunk's acknowledgement, the
// chunk is redelivered and the handler runs again for an event already
// done: its transaction is then rolled back by the completion (which finds
// the record) and the event counts as handled. So the handler's writes to
// the database are applied once; anything else it does (calls to other
// systems) may still happen twice.
type HandlerTxFunc func(ctx context.Context, tx pgx.Tx, m *Message) error

// ErrAlreadyCompleted: the event was completed in a transaction already
// (PQ038), or its chunk was acknowledged by another process (PQ039); the
// transaction that tried to complete it must roll back. A HandlerTxFunc's
// consumer treats it as handled. Nacking a completed event also fails with
// it (PQ038).
var ErrAlreadyCompleted = errors.New("pgque: event already completed")

// txBeginner begins a transaction with options (the Client's pool).
type txBeginner interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}

// completer writes an event's completion record through q, in the
// handler's transaction.
type completer func(ctx context.Context, q *dbq.Queries, m *Message) error

// txHandler makes a HandlerFunc that runs h and then complete in one
// transaction over db. An event found completed already is a success: its
// writes are committed, and this attempt's are rolled back.
//
// A completion that waited out its lock timeout (55P03: the lease row was
// held by a claim in progress, or a plain consumer's subscription row by
// its receive) is not the handler's failure: the transaction is run again, up
// to completionAttempts times, rather than nacked, which would count a
// retry against max_retries and hold a paused key.
func txHandler(db txBeginner, h HandlerTxFunc, complete completer) HandlerFunc {
	return func(ctx context.Context, m *Message) error {
		var err error
		for attempt := 1; ; attempt++ {
			completing := false
			err = pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
				if err := h(ctx, tx, m); err != nil {
					return err
				}
				// Last, just before the commit: the completion's lock on the
				// subscription row (a plain consumer's receives and acks) or
				// the lease row (a takeover) holds them back until the
				// transaction ends.
				completing = true
				if err := complete(ctx, dbq.New(tx), m); err != nil {
					return mapError(fmt.Sprintf("completing event %d", m.ID), err)
				}
				completing = false
				return nil
			})
			if !completing || attempt == completionAttempts || ctx.Err() != nil || !isLockTimeout(err) {
				break
			}
		}
		if errors.Is(err, ErrAlreadyCompleted) {
			return nil
		}
		// A statement cut short because ctx ended says only "context
		// canceled"; the cause says why (ErrLeaseLost when the pool fenced
		// the slot first, before the completion could be refused).
		if cause := context.Cause(ctx); err != nil && ctx.Err() != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		return err
	}
}

// completionAttempts bounds how often txHandler runs a handler whose
// completion timed out waiting for its lock.
const completionAttempts = 3

// isLockTimeout reports whether err is a statement's lock timeout (55P03).
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// handlerOf is the HandlerFunc a consumer calls: handler, or handlerTx
// wrapped in its transaction.
func handlerOf(handler HandlerFunc, handlerTx HandlerTxFunc, db txBeginner, complete completer) HandlerFunc {
	if handlerTx != nil {
		return txHandler(db, handlerTx, complete)
	}
	return handler
}
