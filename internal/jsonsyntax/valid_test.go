package jsonsyntax

import (
	"encoding/json"
	"strings"
	"testing"
)

var cases = []string{
	``, ` `, `{}`, `[]`, `{ }`, `[ ]`, ` {"a":1} `, "\t\n\r[1]\r\n",
	`{"a":1,"b":[true,false,null],"c":{"d":"e"}}`, `{"a" : 1 , "b" : 2}`,
	`"plain"`, `"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00"`, `"\u00"`, `"\u00g0"`, `"\x"`, `"tab	in"`,
	"\"\xff\xfe\"", `"unterminated`, `"`, `""`, `"\`, `"\u12`,
	`0`, `-0`, `01`, `-`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-01`, `123456789012345678901234567890`, `1.2.3`, `+1`,
	`true`, `false`, `null`, `tru`, `truex`, `nul`, `True`, `NULL`,
	`[1,]`, `[,1]`, `[1 2]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{1:2}`, `{"a":1 "b":2}`, `[}`, `{]`, `[[]`, `[]]`, `{}}`,
	`1 2`, `{} {}`, `[1]x`, `nullnull`, "\x00", `[` + strings.Repeat(" ", 3) + `]`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64),
	strings.Repeat("[", 65) + strings.Repeat("]", 65),
	strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth),
	strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1),
	strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100),
	strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 99),
}

// TestValidAgreesWithEncodingJSON: every case, valid or not, gets
// encoding/json's answer.
func TestValidAgreesWithEncodingJSON(t *testing.T) {
	valid := 0
	for _, s := range cases {
		want := json.Valid([]byte(s))
		if got := Valid([]byte(s)); got != want {
			t.Errorf("Valid(%.60q) = %v, encoding/json says %v", s, got, want)
		}
		if want {
			valid++
		}
	}
	// Both answers occur, so a Valid that always says one thing fails.
	if valid == 0 || valid == len(cases) {
		t.Fatalf("%d of %d cases valid: the table must hold both", valid, len(cases))
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range cases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

var payload = []byte(`{"tenant":"tenant-0042","seq":123456,"path":"/files/2026/12/report.pdf","size":12345}`)

func BenchmarkValid(b *testing.B) {
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if !Valid(payload) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkEncodingJSONValid(b *testing.B) {
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if !json.Valid(payload) {
			b.Fatal("invalid")
		}
	}
}
