package pgque

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestMapErrorBySQLSTATE(t *testing.T) {
	t.Parallel()
	for code, sentinel := range sqlstates {
		pgErr := &pgconn.PgError{Code: code, Message: "server says " + code}
		err := mapError("doing X", fmt.Errorf("driver: %w", pgErr))
		if !errors.Is(err, sentinel) {
			t.Errorf("%s: %v does not unwrap to %v", code, err, sentinel)
		}
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != code {
			t.Errorf("%s: %v is not an *Error with the code", code, err)
		}
		var got *pgconn.PgError
		if !errors.As(err, &got) || got != pgErr {
			t.Errorf("%s: %v does not unwrap to the *pgconn.PgError", code, err)
		}
		if want := "doing X: server says " + code + " (SQLSTATE " + code + ")"; err.Error() != want {
			t.Errorf("%s: message %q, want %q", code, err.Error(), want)
		}
	}
}

// TestMapErrorWrapsEveryDatabaseError: a SQLSTATE outside pgque's contract
// still becomes an *Error (no sentinel), an error that is already an *Error
// is not wrapped twice, and errors that never reached the database stay as
// they are.
func TestMapErrorWrapsEveryDatabaseError(t *testing.T) {
	t.Parallel()
	other := &pgconn.PgError{Code: "40001", Message: "serialization failure"}
	err := mapError("doing X", other)
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != "40001" || pe.sentinel != nil {
		t.Fatalf("%v is not a sentinel-less *Error with code 40001", err)
	}
	if !errors.Is(err, other) {
		t.Fatalf("%v lost the driver error", err)
	}
	for _, s := range []error{ErrQueueNotFound, ErrInvalidPayload, ErrLeaseLost} {
		if errors.Is(err, s) {
			t.Fatalf("%v unwraps to %v", err, s)
		}
	}
	if want := "doing X: serialization failure (SQLSTATE 40001)"; err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
	twice := mapError("doing Y", err)
	if want := "doing Y: doing X: serialization failure (SQLSTATE 40001)"; twice.Error() != want {
		t.Fatalf("re-mapped message %q, want %q", twice.Error(), want)
	}
	if err := mapError("doing X", context.Canceled); !errors.Is(err, context.Canceled) || errors.As(err, &pe) {
		t.Fatalf("context.Canceled mapped to %v", err)
	}
	if mapError("doing X", nil) != nil {
		t.Fatal("mapError(nil) is not nil")
	}
}

func TestEventEncode(t *testing.T) {
	t.Parallel()
	typ, payload, key, err := Event{Payload: map[string]int{"a": 1}}.encode()
	if err != nil || typ != EventTypeDefault || string(payload) != `{"a":1}` || key != nil {
		t.Fatalf("encode = %q %s %v %v", typ, payload, key, err)
	}
	_, _, key, _ = Event{Type: "x", Payload: nil, PartitionKey: "k"}.encode()
	if key == nil || *key != "k" {
		t.Fatalf("key = %v, want k", key)
	}
}

func FuzzEventEncodeRawMessage(f *testing.F) {
	for _, s := range []string{`{}`, `[1,2]`, `"x"`, `{oops`, ``, `nul`} {
		f.Add(s)
	}
	// encode must reject exactly the invalid JSON, with ErrInvalidPayload,
	// and pass valid JSON through byte for byte.
	f.Fuzz(func(t *testing.T, s string) {
		_, payload, _, err := Event{Payload: rawJSON(s)}.encode()
		switch valid := json.Valid([]byte(s)); {
		case valid && err != nil:
			t.Fatalf("valid JSON %q rejected: %v", s, err)
		case !valid && !errors.Is(err, ErrInvalidPayload):
			t.Fatalf("invalid JSON %q: error %v, want ErrInvalidPayload", s, err)
		case valid && string(payload) != s:
			t.Fatalf("payload changed: %q → %q", s, payload)
		}
	})
}

func rawJSON(s string) any { return json.RawMessage(s) }
