package web

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// do sends a request to the console and returns the status and body.
func do(t *testing.T, method, url string, header map[string]string, body string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// The console's HTTP contract: strict headers on every response, the JSON
// API, and actions refused unless enabled, same-origin, JSON and carrying
// the token; an action that passes every check works (a dead letter is
// replayed, the rest purged).
func TestConsoleHTTP(t *testing.T) {
	t.Parallel()
	w := startWorkload(t)
	ro, rw := w.serve(t, false), w.serve(t, true)
	pgtest.WaitFor(t, 30*time.Second, "a dead letter", func() bool { return len(w.deadLetters(t)) > 0 })

	for _, path := range []string{"/", "/consumers", "/keys", "/dlq", "/static/app.js", "/api/overview"} {
		code, _, h := do(t, "GET", ro.URL+path, nil, "")
		if code != 200 || h.Get("Content-Security-Policy") != ContentSecurityPolicy || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: %d, headers %v", path, code, h)
		}
	}
	if code, body, _ := do(t, "GET", ro.URL+"/", map[string]string{"Host": "evil.example:80"}, ""); code != http.StatusMisdirectedRequest {
		t.Errorf("GET / with a foreign Host: %d %s, want 421 (DNS rebinding)", code, body)
	}
	var ov overview
	_, body, _ := do(t, "GET", ro.URL+"/api/overview", nil, "")
	if err := json.Unmarshal([]byte(body), &ov); err != nil || len(ov.Queues) != 1 || len(ov.Groups) != 2 || len(ov.Slots) != 6 || ov.ActionsEnabled {
		t.Errorf("overview: %v %+v", err, ov)
	}
	// The dead letters of a partitioned consumer, by its name: every
	// slot's, each naming the consumer and its slot, the payload as JSON.
	var dlq struct {
		DeadLetters []struct {
			Consumer string          `json:"consumer"`
			Slot     *int            `json:"slot"`
			Payload  json.RawMessage `json:"payload"`
		} `json:"dead_letters"`
	}
	_, body, _ = do(t, "GET", ro.URL+"/api/dlq?queue=files&consumer=thumbnails", nil, "")
	if err := json.Unmarshal([]byte(body), &dlq); err != nil || len(dlq.DeadLetters) == 0 {
		t.Errorf("dead letters of thumbnails: %v %s", err, body)
	}
	for _, d := range dlq.DeadLetters {
		var p map[string]string
		if d.Consumer != "thumbnails" || d.Slot == nil || json.Unmarshal(d.Payload, &p) != nil || !strings.Contains(p["name"], "<script>") {
			t.Errorf("dead letter of thumbnails: %+v (payload %s)", d, d.Payload)
		}
	}
	if code, body, _ := do(t, "GET", ro.URL+"/api/keys?queue=files&consumer=nope", nil, ""); code != 404 || !strings.Contains(body, "no slots") {
		t.Errorf("keys of a missing consumer: %d %s", code, body)
	}
	if code, _, _ := do(t, "GET", ro.URL+"/api/dlq", nil, ""); code != 400 {
		t.Errorf("dlq without a queue: %d", code)
	}

	dl := w.deadLetters(t)[0]
	replay := `{"queue":"files","id":` + jsonInt(dl.ID) + `}`
	good := map[string]string{"Content-Type": "application/json", TokenHeader: testToken, "Origin": rw.URL, "Sec-Fetch-Site": "same-origin"}
	with := func(k, v string) map[string]string {
		h := map[string]string{}
		for a, b := range good {
			h[a] = b
		}
		if v == "" {
			delete(h, k)
		} else {
			h[k] = v
		}
		return h
	}
	for _, c := range []struct {
		what   string
		url    string
		method string
		header map[string]string
		want   int
	}{
		{"read-only console", ro.URL, "POST", good, http.StatusForbidden},
		{"no token", rw.URL, "POST", with(TokenHeader, ""), http.StatusUnauthorized},
		{"wrong token", rw.URL, "POST", with(TokenHeader, strings.Repeat("x", 32)), http.StatusUnauthorized},
		{"another origin", rw.URL, "POST", with("Origin", "http://evil.example"), http.StatusForbidden},
		{"cross-site fetch", rw.URL, "POST", with("Sec-Fetch-Site", "cross-site"), http.StatusForbidden},
		{"form post", rw.URL, "POST", with("Content-Type", "application/x-www-form-urlencoded"), http.StatusUnsupportedMediaType},
		{"GET", rw.URL, "GET", good, http.StatusMethodNotAllowed},
	} {
		if code, body, _ := do(t, c.method, c.url+"/api/actions/replay", c.header, replay); code != c.want {
			t.Errorf("%s: %d %s, want %d", c.what, code, body, c.want)
		}
	}
	if n := len(w.deadLetters(t)); n == 0 {
		t.Fatal("a refused replay removed the dead letter")
	}
	if code, body, _ := do(t, "POST", rw.URL+"/api/actions/replay", good, `{"queue":"files","id":-5}`); code != 404 {
		t.Errorf("replay of a missing dead letter: %d %s, want 404", code, body)
	}
	if code, body, _ := do(t, "POST", rw.URL+"/api/actions/nuke", good, replay); code != 404 {
		t.Errorf("unknown action: %d %s", code, body)
	}
	if code, body, _ := do(t, "POST", rw.URL+"/api/actions/replay", good, `{"queue":"files","id":1,"sql":"drop"}`); code != 400 {
		t.Errorf("unknown body field: %d %s", code, body)
	}
	if code, body, _ := do(t, "POST", rw.URL+"/api/actions/replay", good, replay); code != 200 || !strings.Contains(body, jsonInt(dl.EventID)) {
		t.Fatalf("replay: %d %s", code, body)
	}
	for _, d := range w.deadLetters(t) {
		if d.ID == dl.ID {
			t.Errorf("dead letter %d is still there after its replay", dl.ID)
		}
	}
	// The replayed event fails again and comes back; purge removes it.
	pgtest.WaitFor(t, 30*time.Second, "the replayed event to be dead-lettered again", func() bool { return len(w.deadLetters(t)) > 0 })
	if code, body, _ := do(t, "POST", rw.URL+"/api/actions/purge", good, `{"queue":"files","older_than_seconds":1e10}`); code != 400 ||
		!strings.Contains(body, "older_than_seconds must be between 0 and") {
		t.Errorf("purge older than 1e10 s: %d %s, want 400 naming the bound", code, body)
	}
	if code, body, _ := do(t, "POST", rw.URL+"/api/actions/purge", good, `{"queue":"files"}`); code != 200 || strings.Contains(body, `"result":0`) {
		t.Errorf("purge: %d %s", code, body)
	}
}

func jsonInt(n int64) string { b, _ := json.Marshal(n); return string(b) }
