package jsonsyntax

import (
	"bytes"
	"strings"
	"testing"
)

// TestNumericOverflow: the number returned is the first one past a limit,
// as it is written; strings (keys included) and escaped quotes in them are
// skipped. The limits themselves are checked against a server by the root
// package's TestNumericOverflowAgreesWithTheServer.
func TestNumericOverflow(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"a": 1, "b": [2.5e10, -3E-7]}`, ""},
		{`[1e131071, 1e131072, 1e-16384]`, "1e131072"},
		{`{"1e131072": "1e-16384", "x": "\"1e131072\""}`, ""},
		{`{"x": "\\", "y": -1E+131072}`, "-1E+131072"},
		{`0e99999999999999999999`, "0e99999999999999999999"},
		{`[0e200000, 0.5e131072, 0.05e131073]`, ""},
		{`[0.5e131073]`, "0.5e131073"},
		{`[0.0e-16383]`, "0.0e-16383"},
		{`"1e131072`, ""}, // not JSON: an unterminated string
	} {
		got := NumericOverflow([]byte(c.json))
		if string(got) != c.want || (got == nil) != (c.want == "") {
			t.Errorf("NumericOverflow(%s) = %q, want %q", c.json, got, c.want)
		}
	}
	long := []byte("[" + strings.Repeat("9", 131073) + "]")
	if got := NumericOverflow(long); !bytes.Equal(got, long[1:len(long)-1]) {
		t.Errorf("NumericOverflow of 131 073 nines returned %d bytes", len(got))
	}
}

// FuzzNumericOverflow: any input, JSON or not, gets an answer without a
// panic, and a number returned is a slice of the input that is a JSON
// number.
func FuzzNumericOverflow(f *testing.F) {
	for _, s := range append(cases, `[1e131072]`, `{"a":"\"", "b": 1e-16384}`, `"`, `-`, `1e`, `1e-`) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		n := NumericOverflow(b)
		if n != nil && (!bytes.Contains(b, n) || numberEnd(n, 0) != len(n)) {
			t.Fatalf("NumericOverflow(%q) = %q, which is no number of the input", b, n)
		}
	})
}

func BenchmarkNumericOverflow(b *testing.B) {
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if NumericOverflow(payload) != nil {
			b.Fatal("overflow")
		}
	}
}
