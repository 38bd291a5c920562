package dbq

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestLeaseTokenNeverPrints: every way a token can end up in text — fmt
// verbs, a struct that holds it, log/slog text and JSON handlers, JSON
// encoding — shows it redacted, while Value and Secret still give the
// driver the token itself.
func TestLeaseTokenNeverPrints(t *testing.T) {
	const secret = "6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab"
	tok := LeaseToken(secret)
	holder := struct {
		Slot  int
		Token LeaseToken
	}{3, tok}
	var out []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s"} {
		out = append(out, fmt.Sprintf(verb, tok), fmt.Sprintf(verb, holder), fmt.Sprintf(verb, &holder))
	}
	out = append(out, fmt.Sprint(tok), fmt.Sprintln(tok, holder), tok.String(), tok.GoString())
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("lease", slog.Any("token", tok), slog.Any("holder", holder), "raw", tok)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("lease", slog.Any("token", tok), slog.Any("holder", holder), "raw", tok)
	out = append(out, logs.String())
	js, err := json.Marshal(holder)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, string(js))
	for _, s := range out {
		if strings.Contains(s, secret) || strings.Contains(s, secret[:8]) || strings.Contains(s, fmt.Sprintf("%x", secret)[:16]) {
			t.Errorf("the token leaks: %s", s)
		}
	}
	if v, err := tok.Value(); err != nil || v != secret || tok.Secret() != secret {
		t.Errorf("Value = %v, %v; Secret = %q; want the token", v, err, tok.Secret())
	}
	if v, err := LeaseToken("").Value(); err != nil || v != nil {
		t.Errorf("empty token Value = %v, %v; want NULL", v, err)
	}
}
