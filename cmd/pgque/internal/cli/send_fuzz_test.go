package cli

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// FuzzReadEvents feeds arbitrary stdin to `pgque send`'s line parser: it
// must never panic, and what it accepts must be events whose payloads are
// valid JSON (so nothing invalid reaches the database); in plain mode one
// event per non-blank line, sent verbatim.
func FuzzReadEvents(f *testing.F) {
	for _, s := range []struct {
		in       string
		envelope bool
	}{
		{"{\"a\":1}\n{\"b\":2}\n", false},
		{"{\"a\":1} {\"b\":2}\n", false},
		{"\n\n  \n[1,2]\n", false},
		{"{\"type\":\"T\",\"key\":\"k\",\"payload\":{\"x\":1}}\n", true},
		{"{\"payload\":null}\n", true},
		{"{\"type\":\"T\",\"payload\":1,\"extra\":2}\n", true},
		{"{\"key\":\"'); drop table x; --\",\"payload\":\"$$\"}\n", true},
		{"\xff\xfe\n", false},
		{"\"\\u0000\"\n", false},
	} {
		f.Add([]byte(s.in), "typ", "key", s.envelope)
	}
	f.Fuzz(func(t *testing.T, in []byte, typ, key string, envelope bool) {
		events, err := readEvents(bytes.NewReader(in), typ, key, envelope)
		if err != nil {
			if events != nil {
				t.Fatalf("error %v with %d events: nothing may be sent on error", err, len(events))
			}
			return
		}
		for i, ev := range events {
			raw, ok := ev.Payload.(json.RawMessage)
			if !ok {
				t.Fatalf("event %d payload is %T, want json.RawMessage", i, ev.Payload)
			}
			if !json.Valid(raw) {
				t.Fatalf("event %d payload %q is not valid JSON", i, raw)
			}
		}
		if !envelope {
			var lines []string
			for _, l := range strings.Split(string(in), "\n") {
				if l = string(bytes.TrimSpace([]byte(l))); l != "" {
					lines = append(lines, l)
				}
			}
			if len(lines) != len(events) {
				t.Fatalf("%d non-blank lines gave %d events", len(lines), len(events))
			}
			for i, ev := range events {
				if string(ev.Payload.(json.RawMessage)) != lines[i] || ev.Type != typ || ev.PartitionKey != key {
					t.Fatalf("line %d %q sent as %q (type %q key %q)", i+1, lines[i], ev.Payload, ev.Type, ev.PartitionKey)
				}
			}
		}
	})
}

var workerIDChars = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// FuzzSanitizeName: whatever the host name, the worker id built from it
// is non-empty and made of name characters only.
func FuzzSanitizeName(f *testing.F) {
	for _, s := range []string{"", "host", "héllo wörld", "a;b'c\"d", "\x00\xff", "$$"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := sanitizeName(s)
		if !workerIDChars.MatchString(got) {
			t.Fatalf("sanitizeName(%q) = %q", s, got)
		}
	})
}
