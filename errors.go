package pgque

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Sentinel errors. Test for them with errors.Is. Every error the database
// raises is returned as an *Error (wrapped as "doing X: ...") that unwraps
// to the driver's *pgconn.PgError and, for the SQLSTATEs of pgque's SQL
// contract and the payload encoding errors, to one of these (chosen by
// SQLSTATE, never by message text). Errors that never reached the database
// (a broken connection, a cancelled context) are wrapped unchanged.
var (
	// ErrQueueNotFound: the queue does not exist (SQLSTATE PQ001).
	ErrQueueNotFound = errors.New("pgque: queue not found")
	// ErrConsumerNotFound: the subscription does not exist (PQ002).
	ErrConsumerNotFound = errors.New("pgque: consumer not found")
	// ErrInvalidName: a queue or consumer name is empty, too long, has bad
	// characters or uses the reserved '#' or '/' (PQ010).
	ErrInvalidName = errors.New("pgque: invalid name")
	// ErrInvalidArgument: an argument is NULL or out of range: negative
	// delay, slot out of range, bad TTL, bad config value (PQ011, 22004), an
	// empty or over-long dedup key (PQ063), or a Config field failed
	// validation.
	ErrInvalidArgument = errors.New("pgque: invalid argument")
	// ErrUnknownParameter: set_queue_config got an unknown parameter (PQ012).
	ErrUnknownParameter = errors.New("pgque: unknown queue parameter")
	// ErrBatchNotOpen: the batch is unknown, finished, or belongs to another
	// subscription (PQ020).
	ErrBatchNotOpen = errors.New("pgque: batch not open")
	// ErrEventNotInBatch: nack named an event that is not in the batch (PQ022).
	ErrEventNotInBatch = errors.New("pgque: event not in batch")
	// ErrSlotCountMismatch: the slot count differs from the one persisted for
	// (queue, consumer) (PQ030).
	ErrSlotCountMismatch = errors.New("pgque: slot count mismatch")
	// ErrPolicyMismatch: the failure policy differs from the one persisted
	// for (queue, consumer) (PQ031); change it with Client.SetFailurePolicy.
	ErrPolicyMismatch = errors.New("pgque: failure policy mismatch")
	// ErrLeaseLost: this worker does not hold the slot's lease any more —
	// taken over, released, or expired (PQ032), or its lease token does not
	// prove the lease (PQ085). A handler's context is
	// cancelled with this cause when its slot is fenced.
	ErrLeaseLost = errors.New("pgque: slot lease lost")
	// ErrSlotSubscription: the plain receive/ack/nack API was used on a slot
	// subscription (PQ033).
	ErrSlotSubscription = errors.New("pgque: plain API used on a slot subscription")
	// ErrSlotNotSubscribed: the slot is not subscribed (PQ034), or the
	// consumer to resize has no slots (PQ071).
	ErrSlotNotSubscribed = errors.New("pgque: slot not subscribed")
	// ErrKeyNotBlocked: UnblockKey or RetryKeyNow named a key that is not
	// blocked by a failing head (PQ036).
	ErrKeyNotBlocked = errors.New("pgque: key not blocked")
	// ErrKeyBusy: the blocked key's head is being redelivered right now;
	// try UnblockKey again once that delivery was handled (PQ037).
	ErrKeyBusy = errors.New("pgque: key head in flight, try again")
	// ErrResizeInProgress: the consumer's slots are being resized: a second
	// ResizeSlots (PQ070) or an unsubscribe (PQ073) must wait for the
	// cutover.
	ErrResizeInProgress = errors.New("pgque: slot resize in progress")
	// ErrDeadLetterNotFound: the dead letter does not exist (PQ040).
	ErrDeadLetterNotFound = errors.New("pgque: dead letter not found")
	// ErrTableAttached: the table is attached to a queue (attach_table), so
	// TRUNCATE on it (PQ060) or dropping the queue (PQ062) is refused, or a
	// write to it found the attachment's triggers incomplete (PQ064).
	ErrTableAttached = errors.New("pgque: table attached to a queue")
	// ErrTableNotAttached: detach_table named a table that is not attached
	// to the queue (PQ061).
	ErrTableNotAttached = errors.New("pgque: table not attached")
	// ErrPermissionDenied: the role may not call this function, or the
	// queue is confined (grant_queue) and the login may not do that on it:
	// consume or produce, or read its dead letters, keys, slots and status
	// (42501). PostgreSQL's own refusals ("permission denied for function
	// send", "... for schema pgque") go on to name the pgque roles.
	ErrPermissionDenied = errors.New("pgque: permission denied")
	// ErrInvalidPayload: an event payload is not valid JSON, could not be
	// marshalled, holds a number PostgreSQL's numeric cannot (such as
	// 1e131072), or holds text PostgreSQL cannot store (SQLSTATE 22P02,
	// 22P05, 22021). Most are detected before the database is touched.
	ErrInvalidPayload = errors.New("pgque: invalid payload")
	// ErrAlreadyStarted: Start was called twice on a service.
	ErrAlreadyStarted = errors.New("pgque: already started")
	// ErrSchemaVersion: the database holds another pgque schema version than
	// the library's SchemaVersion (a *SchemaVersionError says which).
	ErrSchemaVersion = errors.New("pgque: schema version mismatch")
	// ErrNotInstalled: pgque is not installed in the database.
	ErrNotInstalled = errors.New("pgque: not installed")
	// ErrDeadLetter marks a handler error made by DeadLetter: the event is
	// dead-lettered at once, without further retries.
	ErrDeadLetter = errors.New("pgque: dead-lettered by the handler")
	// ErrHandlerTimeout: the handler ran longer than its consumer's
	// HandlerTimeout (its context's cause); the event is nacked.
	ErrHandlerTimeout = errors.New("pgque: handler timed out")
	// ErrHandlerPanic wraps the value of a recovered handler panic; the event
	// is nacked like any other failure.
	ErrHandlerPanic = errors.New("pgque: handler panicked")
)

// sqlstates maps each stable SQLSTATE of the SQL contract to its sentinel.
var sqlstates = map[string]error{
	"22004": ErrInvalidArgument,
	"22021": ErrInvalidPayload, // character_not_in_repertoire
	"22P02": ErrInvalidPayload, // invalid_text_representation (bad JSON)
	"22P05": ErrInvalidPayload, // untranslatable_character (\u0000)
	"42501": ErrPermissionDenied,
	"PQ001": ErrQueueNotFound,
	"PQ002": ErrConsumerNotFound,
	"PQ010": ErrInvalidName,
	"PQ011": ErrInvalidArgument,
	"PQ012": ErrUnknownParameter,
	"PQ020": ErrBatchNotOpen,
	"PQ022": ErrEventNotInBatch,
	"PQ030": ErrSlotCountMismatch,
	"PQ031": ErrPolicyMismatch,
	"PQ032": ErrLeaseLost,
	"PQ033": ErrSlotSubscription,
	"PQ034": ErrSlotNotSubscribed,
	// A fenced ack or nack named a chunk that is no longer the slot's
	// current delivery: for this worker it is the same as losing the lease.
	"PQ035": ErrLeaseLost,
	// The lease token presented does not prove the current lease: taken
	// over by a new claim (which got a new token), released, or never held.
	"PQ085": ErrLeaseLost,
	"PQ036": ErrKeyNotBlocked,
	"PQ037": ErrKeyBusy,
	"PQ038": ErrAlreadyCompleted,
	"PQ039": ErrAlreadyCompleted,
	"PQ040": ErrDeadLetterNotFound,
	"PQ070": ErrResizeInProgress,
	"PQ071": ErrSlotNotSubscribed,
	"PQ072": ErrInvalidArgument,
	"PQ073": ErrResizeInProgress,
	"PQ074": ErrInvalidArgument,
	"PQ063": ErrInvalidArgument,
	"PQ060": ErrTableAttached,
	"PQ061": ErrTableNotAttached,
	"PQ062": ErrTableAttached,
	"PQ064": ErrTableAttached,
}

// Error is an error raised by pgque's SQL. It carries the SQLSTATE and
// unwraps both to the matching sentinel (errors.Is(err, ErrLeaseLost)) and to
// the driver's *pgconn.PgError (errors.As).
type Error struct {
	// Code is the SQLSTATE, e.g. "PQ001".
	Code string
	// Message is the server's message; it names the offending value.
	Message string

	sentinel error
	pgErr    *pgconn.PgError
}

// roleHint follows PostgreSQL's own permission errors (42501 "permission
// denied for function send", "... for schema pgque"): they name the object,
// not the pgque role that grants it. pgque's own 42501 errors say more.
const roleHint = "pgque_writer may send, pgque_reader may consume, pgque_admin may do both and administer: " +
	"grant the login the role its job needs"

// Error returns the server's message followed by the SQLSTATE, and by
// roleHint for PostgreSQL's own permission errors.
func (e *Error) Error() string {
	if e.Code == "42501" && strings.HasPrefix(e.Message, "permission denied for ") {
		return fmt.Sprintf("%s (SQLSTATE %s; %s)", e.Message, e.Code, roleHint)
	}
	return fmt.Sprintf("%s (SQLSTATE %s)", e.Message, e.Code)
}

// Unwrap returns the sentinel and the driver error.
func (e *Error) Unwrap() []error {
	if e.sentinel == nil {
		return []error{e.pgErr}
	}
	return []error{e.sentinel, e.pgErr}
}

// mapError turns a *pgconn.PgError into an *Error (with the sentinel of its
// SQLSTATE, if any) and wraps it as "doing: error". Other errors are wrapped
// unchanged.
func mapError(doing string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	var already *Error
	if errors.As(err, &pgErr) && !errors.As(err, &already) {
		err = &Error{Code: pgErr.Code, Message: pgErr.Message, sentinel: sqlstates[pgErr.Code], pgErr: pgErr}
	}
	return fmt.Errorf("%s: %w", doing, err)
}
