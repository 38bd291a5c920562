package pgque

import "testing"

// TestRefusedEscape: the escapes jsonb refuses are found, and a pair, an
// escaped backslash before "u0000" and other escapes are not.
func TestRefusedEscape(t *testing.T) {
	for _, c := range []struct {
		json string
		want bool
	}{
		{`{"a":"\u0000"}`, true},
		{`["\ud83d"]`, true},
		{`["\uD83Dx"]`, true},
		{`["\ude00"]`, true},
		{`["\ud83d\u0041"]`, true},
		{`["\ud83d\ude00"]`, false},
		{`["\uD55C\u003c"]`, false},
		{`["\\u0000"]`, false},
		{`["\\\u0000"]`, true},
		{`{"a":"\"\n\t"}`, false},
		{`["\ud83d`, true},
		{`[1, {"b": 2}]`, false},
	} {
		if got := refusedEscape(c.json); got != c.want {
			t.Errorf("refusedEscape(%s) = %v, want %v", c.json, got, c.want)
		}
	}
	if got := nesting(`[{"a": "[[[", "b": [[1]]}]`); got != 4 {
		t.Errorf("nesting = %d, want 4", got)
	}
}
