package pgque

import (
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestSanitizeReason(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"a\x00b", "a\uFFFDb"},
		{"\xff", "\uFFFD"},
		{"ok \xe2\x82", "ok \uFFFD"},
		{"\xed\xa0\x80", "\uFFFD"},
		{strings.Repeat("a", ReasonMaxBytes), strings.Repeat("a", ReasonMaxBytes)},
		{strings.Repeat("a", ReasonMaxBytes+1), strings.Repeat("a", ReasonMaxBytes)},
		{strings.Repeat("a", ReasonMaxBytes-1) + "€", strings.Repeat("a", ReasonMaxBytes-1)},
		{strings.Repeat("a", ReasonMaxBytes-2) + "€", strings.Repeat("a", ReasonMaxBytes-2)},
		{strings.Repeat("a", ReasonMaxBytes-3) + "€", strings.Repeat("a", ReasonMaxBytes-3) + "€"},
		{strings.Repeat("a", ReasonMaxBytes-1) + "\x00", strings.Repeat("a", ReasonMaxBytes-1)},
	}
	for _, c := range cases {
		if got := sanitizeReason(c.in); got != c.want {
			t.Errorf("sanitizeReason(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestClampRetryDelay(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{-1, 0}, {math.MinInt64, 0}, {0, 0}, {time.Second, time.Second},
		{RetryDelayMax, RetryDelayMax}, {RetryDelayMax + 1, RetryDelayMax}, {math.MaxInt64, RetryDelayMax},
	} {
		if got := clampRetryDelay(c.in); got != c.want {
			t.Errorf("clampRetryDelay(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if d := safeRetryDelay(func(int) time.Duration { panic("x") }, 0); d <= 0 || d > RetryDelayMax {
		t.Errorf("safeRetryDelay of a panicking func = %v", d)
	}
}

func TestCheckText(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"w", true}, {strings.Repeat("w", 200), true}, {strings.Repeat("w", 201), false},
		{strings.Repeat("é", 100), true}, {strings.Repeat("é", 101), false},
		{"a\x00", false}, {"\xff", false}, {"\xc3", false},
	} {
		if got := checkText(c.in, 200) == ""; got != c.ok {
			t.Errorf("checkText(%q) ok = %v, want %v", c.in, got, c.ok)
		}
	}
}

// FuzzSanitizeReason: the result is always storable as PostgreSQL text
// (valid UTF-8, no NUL), within ReasonMaxBytes, and a valid NUL-free input
// within the limit is kept unchanged.
func FuzzSanitizeReason(f *testing.F) {
	for _, s := range []string{"", "boom", "a\x00b", "\xff\xfe", strings.Repeat("a", 999) + "€", strings.Repeat("😀", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := sanitizeReason(s)
		if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 || len(got) > ReasonMaxBytes {
			t.Fatalf("sanitizeReason(%q) = %q: not storable", s, got)
		}
		if checkText(s, ReasonMaxBytes) == "" && got != s {
			t.Fatalf("sanitizeReason changed a valid text %q to %q", s, got)
		}
		if len(s) > 0 && len(got) == 0 && len(s) < ReasonMaxBytes {
			t.Fatalf("sanitizeReason(%q) lost everything", s)
		}
	})
}
