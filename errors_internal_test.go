package pgque

import (
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

func TestMapErrorLeavesOtherErrorsAlone(t *testing.T) {
	t.Parallel()
	other := &pgconn.PgError{Code: "40001", Message: "serialization failure"}
	err := mapError("doing X", other)
	var pe *Error
	if errors.As(err, &pe) {
		t.Fatalf("%v became an *Error", err)
	}
	if !errors.Is(err, other) {
		t.Fatalf("%v lost the driver error", err)
	}
	if mapError("doing X", nil) != nil {
		t.Fatal("mapError(nil) is not nil")
	}
}

func TestEventEncode(t *testing.T) {
	t.Parallel()
	typ, payload, key, dedup, err := Event{Payload: map[string]int{"a": 1}}.encode()
	if err != nil || typ != EventTypeDefault || string(payload) != `{"a":1}` || key != nil || dedup != nil {
		t.Fatalf("encode = %q %s %v %v %v", typ, payload, key, dedup, err)
	}
	_, _, key, dedup, _ = Event{Type: "x", Payload: nil, PartitionKey: "k", DedupKey: "d"}.encode()
	if key == nil || *key != "k" || dedup == nil || *dedup != "d" {
		t.Fatalf("key = %v, dedup = %v, want k, d", key, dedup)
	}
}

func FuzzEventEncodeRawMessage(f *testing.F) {
	for _, s := range []string{`{}`, `[1,2]`, `"x"`, `{oops`, ``, `nul`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, payload, _, _, err := Event{Payload: rawJSON(s)}.encode()
		if err != nil {
			if !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("error %v is not ErrInvalidPayload", err)
			}
			return
		}
		if string(payload) != s {
			t.Fatalf("payload changed: %q → %q", s, payload)
		}
	})
}

func rawJSON(s string) any { return json.RawMessage(s) }
