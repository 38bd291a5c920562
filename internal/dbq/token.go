package dbq

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
)

// LeaseToken is the secret credential of a slot lease: claim_slot returns
// it to the claimer alone and the server keeps only its SHA-256, so every
// call that acts as the lease holder presents it. The worker id is a
// display name that anyone may see; the token is what proves the lease.
//
// It never prints: String, GoString, Format and LogValue all redact it, so
// a lease that ends up in a log line, an error or a %v leaks nothing. Only
// Secret gives the value, for the statements that must send it.
type LeaseToken string

// redacted is what a token prints as.
const redacted = "[redacted]"

// Secret returns the token's value, for sending it to the server.
func (t LeaseToken) Secret() string { return string(t) }

// String redacts the token.
func (t LeaseToken) String() string { return redacted }

// GoString redacts the token.
func (t LeaseToken) GoString() string { return redacted }

// Format redacts the token whatever the verb.
func (t LeaseToken) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue redacts the token in log/slog records.
func (t LeaseToken) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText redacts the token in JSON and other text encodings.
func (t LeaseToken) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// Value gives the token to the driver: NULL when empty. Statements take the
// token itself, not its string, so that a query tracer or logger that
// prints statement arguments prints it redacted.
func (t LeaseToken) Value() (driver.Value, error) {
	if t == "" {
		return nil, nil
	}
	return string(t), nil
}

// NotLeaseHolder reports whether err is the server's refusal of a caller
// whose lease token does not prove the slot's lease (PQ085): the lease
// changed hands or was released.
func NotLeaseHolder(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "PQ085"
}
