package pgque

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzEventEncode checks that every payload reaches the database as valid
// JSON: a json.RawMessage is sent byte for byte when valid and rejected
// with ErrInvalidPayload (before any database call) when not; any other
// payload is marshalled; the type defaults and an empty key means NULL.
func FuzzEventEncode(f *testing.F) {
	for _, s := range []struct{ payload, typ, key string }{
		{`{"a":1}`, "FileCreated", "tenant-1"},
		{`{"a":`, "", ""},
		{`null`, "x", "'); drop table pgque.queue; --"},
		{`"\u0000"`, "t", "k\x00"},
		{"\"\xff\xfe\"", "t", "\xff"},
		{`{"a":1} {"b":2}`, "t", "k"},
		{` [1, 2.5e10, true] `, "$$", "$$;"},
		{``, "", ""},
	} {
		f.Add([]byte(s.payload), s.typ, s.key)
	}
	f.Fuzz(func(t *testing.T, payload []byte, typ, key string) {
		ev := Event{Type: typ, Payload: json.RawMessage(payload), PartitionKey: key}
		gotType, gotPayload, gotKey, _, err := ev.encode()
		if !json.Valid(payload) {
			if err == nil || !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("invalid JSON %q accepted (err %v)", payload, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid JSON %q rejected: %v", payload, err)
		}
		if !bytes.Equal(gotPayload, payload) {
			t.Fatalf("payload changed: %q -> %q", payload, gotPayload)
		}
		if (typ == "" && gotType != EventTypeDefault) || (typ != "" && gotType != typ) {
			t.Fatalf("type %q encoded as %q", typ, gotType)
		}
		if (key == "") != (gotKey == nil) || (gotKey != nil && *gotKey != key) {
			t.Fatalf("key %q encoded as %v", key, gotKey)
		}

		// Any Go value that marshals gives valid JSON.
		ev2 := Event{Type: typ, Payload: map[string]any{"s": string(payload), "k": key}}
		_, p2, _, _, err := ev2.encode()
		if err != nil || !json.Valid(p2) {
			t.Fatalf("marshalled payload invalid: %q, %v", p2, err)
		}
		if utf8.ValidString(key) {
			var back map[string]string
			if err := json.Unmarshal(p2, &back); err != nil || back["k"] != key {
				t.Fatalf("key %q did not round-trip through JSON: %v %q", key, err, back["k"])
			}
		}
	})
}
