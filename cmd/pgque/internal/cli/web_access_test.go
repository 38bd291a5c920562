package cli

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/web"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// get sends a GET with the given Host (and header) through client and
// returns the status and body.
func get(t *testing.T, client *http.Client, url, host string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWebRebindingHost: a console on a loopback address answers only to
// loopback Host names; no console answers a request without its token, so
// a page that rebinds its own name to the console (Host evil.example)
// reads nothing, nor does another local user who reaches a loopback
// console (it read dead letters with the console's database role), while
// the operator who opened /#token= once (the page sends the header) or
// sends the header reads the queues. The page and its script hold no data
// and are served without the token; no response sets a cookie (a cookie
// reaches every port of the host).
func TestWebRebindingHost(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	c.ok("", "queue", "create", "secretq")
	client, err := pgque.NewClient(pgtest.Pool(t, c.dsn), &pgque.Config{Logger: slog.New(slog.DiscardHandler), PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(listenHost string) (*httptest.Server, web.Config) {
		cfg, generated := webAccess(listenHost, false, nil, "")
		if !cfg.RequireToken || !generated || len(cfg.Token) < web.MinTokenLength {
			t.Fatalf("%s: token %q (generated %v)", listenHost, cfg.Token, generated)
		}
		cfg.Client, cfg.Logger = client, slog.New(slog.DiscardHandler)
		srv, err := web.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		return hs, cfg
	}

	loop, loopCfg := serve("127.0.0.1")
	for host, want := range map[string]int{"evil.example": http.StatusMisdirectedRequest, "evil.example:8642": http.StatusMisdirectedRequest,
		"localhost:8642": http.StatusUnauthorized, "127.0.0.1": http.StatusUnauthorized, "[::1]:8642": http.StatusUnauthorized} {
		for _, path := range []string{"/api/overview", "/api/dlq?queue=secretq"} {
			if code, body := get(t, http.DefaultClient, loop.URL+path, host, nil); code != want || strings.Contains(body, "secretq") {
				t.Errorf("loopback console, GET %s as Host %s without the token: %d %s, want %d", path, host, code, body, want)
			}
		}
		pageWant := want
		if want == http.StatusUnauthorized {
			pageWant = http.StatusOK
		}
		if code, body := get(t, http.DefaultClient, loop.URL+"/", host, nil); code != pageWant || strings.Contains(body, "secretq") {
			t.Errorf("loopback console, GET / as Host %s without the token: %d %s, want %d and no data", host, code, body, pageWant)
		}
		if want == http.StatusUnauthorized {
			if code, body := get(t, http.DefaultClient, loop.URL+"/api/overview", host, map[string]string{web.TokenHeader: loopCfg.Token}); code != http.StatusOK || !strings.Contains(body, "secretq") {
				t.Errorf("loopback console, Host %s with the token: %d %s", host, code, body)
			}
		}
	}

	for _, listenHost := range []string{"0.0.0.0", "::", "192.0.2.1"} {
		exposed, cfg := serve(listenHost)
		for _, path := range []string{"/api/overview", "/api/dlq?queue=secretq", "/", "/static/app.js"} {
			for _, host := range []string{"evil.example:8642", "127.0.0.1"} {
				code, body := get(t, http.DefaultClient, exposed.URL+path, host, nil)
				want := http.StatusUnauthorized
				if !strings.HasPrefix(path, "/api/") {
					want = http.StatusOK // the page and its script: no data
				}
				if code != want || strings.Contains(body, "secretq") {
					t.Errorf("%s console, GET %s as Host %s without the token: %d %s, want %d", listenHost, path, host, code, body, want)
				}
			}
		}
		if code, _ := get(t, http.DefaultClient, exposed.URL+"/api/overview", "evil.example", map[string]string{web.TokenHeader: "0123456789abcdef-wrong"}); code != http.StatusUnauthorized {
			t.Errorf("%s console, wrong token: %d, want 401", listenHost, code)
		}
		if code, body := get(t, http.DefaultClient, exposed.URL+"/api/overview", "192.0.2.1:8642", map[string]string{web.TokenHeader: cfg.Token}); code != http.StatusOK || !strings.Contains(body, "secretq") {
			t.Errorf("%s console, token in the header: %d %s", listenHost, code, body)
		}
		// A browser that opens /keys?token= gets the page and no cookie:
		// its script takes the token into the tab's session storage
		// (TestConsoleTokenInBrowser), and nothing else may carry it.
		jar, err := cookiejar.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		browser := &http.Client{Jar: jar}
		code, _ := get(t, browser, exposed.URL+"/keys?"+web.TokenParam+"="+cfg.Token, "", nil)
		u, _ := url.Parse(exposed.URL)
		if code != http.StatusOK || len(jar.Cookies(u)) != 0 {
			t.Errorf("%s console, opening /keys?token=: %d, cookies %v (want 200, none)", listenHost, code, jar.Cookies(u))
		}
		if code, body := get(t, browser, exposed.URL+"/api/overview", "", map[string]string{"Cookie": "pgque_token=" + cfg.Token}); code != http.StatusUnauthorized {
			t.Errorf("%s console, the token in a cookie: %d %s, want 401", listenHost, code, body)
		}
	}
}
