package web

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// EnvScreenshots names a directory where the browser test saves its
// screenshots (the docs use docs/console).
const EnvScreenshots = "PGQUE_CONSOLE_SCREENSHOTS"

// chromiumPath finds Debian's chromium. Missing, the test fails under CI
// (CI=true), where scripts/install-deps installs it, and skips elsewhere.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (scripts/install-deps installs it: apt-get install -y chromium)")
	}
	t.Skip("chromium is not installed; the console's browser test needs it (apt-get install -y chromium)")
	return ""
}

// browser is one headless chromium with a tab, recording every request it
// makes and every console message, exception and browser log entry (where
// CSP violations are reported).
type browser struct {
	ctx context.Context

	mu       sync.Mutex
	requests []string
	console  []string
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	b := &browser{ctx: ctx}
	// The first call starts the browser; it must not run under a timeout.
	err := chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			b.requests = append(b.requests, ev.Request.URL)
		case *runtime.EventConsoleAPICalled:
			for _, a := range ev.Args {
				b.console = append(b.console, string(ev.Type)+": "+string(a.Value)+" "+a.Description)
			}
		case *runtime.EventExceptionThrown:
			b.console = append(b.console, "exception: "+ev.ExceptionDetails.Text)
		case *cdplog.EventEntryAdded:
			b.console = append(b.console, "log: "+ev.Entry.Text)
		}
	})
	if err == nil {
		_, err = chromedp.Call(ctx, network.Enable, network.EnableParams{})
	}
	if err == nil {
		_, err = chromedp.Call(ctx, cdplog.Enable, cdp.Empty{})
	}
	if err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return b
}

// void drops an action's value, so that it can be one of several steps.
func void[T any](a chromedp.Action[T]) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := a(ctx, tg)
		return chromedp.Void{}, err
	}
}

// until waits for a JavaScript expression to be true.
func until(expr string) chromedp.Action[chromedp.Void] {
	return void(chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(40*time.Second)))
}

// do runs steps with a deadline.
func (b *browser) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 45*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression (awaiting a promise).
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 45*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// open loads a page and waits until its script has rendered live data at
// least twice and cond (a JavaScript expression) holds.
func (b *browser) open(t *testing.T, url, page, cond string) {
	t.Helper()
	b.do(t, "opening "+url, chromedp.Navigate(url),
		until(`document.body.dataset.loaded === "`+page+`" && Number(document.body.dataset.refreshes) >= 2 && (`+cond+`)`))
}

// text returns the text of the first element matching the CSS selector.
func (b *browser) text(t *testing.T, sel string) string {
	t.Helper()
	return eval[string](t, b, `document.querySelector(`+strconv.Quote(sel)+`).textContent`)
}

// screenshot saves the page as name.png under $PGQUE_CONSOLE_SCREENSHOTS.
func (b *browser) screenshot(t *testing.T, name string) {
	t.Helper()
	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 45*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConsoleInBrowser drives the console in headless chromium over a live
// workload: every page renders live data; hostile keys and payloads are
// shown as text, never run; an action is refused without the token and
// works with it; a read-only console offers no action and refuses one; and
// no page loads anything from another origin or trips the CSP.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	b := startBrowser(t)
	w := startWorkload(t)
	rw, ro := w.serve(t, true), w.serve(t, false)
	pgtest.WaitFor(t, 30*time.Second, "tenant-stuck to be blocked and a dead letter", func() bool {
		return w.blockedKey(t, stuckKey) && len(w.deadLetters(t)) > 0
	})

	b.open(t, rw.URL+"/", "queues", `document.querySelector("#queues").textContent.includes("files") && document.querySelectorAll(".chart path.line").length >= 2`)
	if s := b.text(t, "#queues tbody"); !strings.Contains(s, "table 1 of 3") {
		t.Errorf("queues page: %q", s)
	}
	b.screenshot(t, "queues")

	b.open(t, rw.URL+"/consumers", "consumers", `document.querySelectorAll("#slots tbody tr").length === 6 && !document.querySelector("#slots").textContent.includes("unowned")`)
	if s := b.text(t, "#groups tbody"); !strings.Contains(s, "indexer") || !strings.Contains(s, "thumbnails") || !strings.Contains(s, "pause") {
		t.Errorf("consumers page groups: %q", s)
	}
	b.screenshot(t, "consumers")

	keys := rw.URL + "/keys?queue=files&consumer=indexer"
	b.open(t, keys, "keys", `document.querySelector("#blocked").textContent.includes("tenant-stuck") && document.querySelector("#hot").textContent.includes("tenant-hot")`)
	if s := b.text(t, "#heads tbody"); !strings.Contains(s, "blocked") || !strings.Contains(s, "503 Service Unavailable") {
		t.Errorf("keys page heads: %q", s)
	}
	b.screenshot(t, "keys")

	b.open(t, rw.URL+"/dlq?queue=files", "dlq", `document.querySelector("#dead-letters").textContent.includes("decoder")`)
	b.do(t, "inspecting a dead letter", chromedp.Click(chromedp.CSS(`#dead-letters tbody button`)), until(`document.querySelector("#payload") !== null`))
	if s := b.text(t, "#payload"); !strings.Contains(s, "<script>document.body.dataset.pwned=1</script>") {
		t.Errorf("payload shown as %q, want the markup as text", s)
	}
	// Keys are shown quoted as JSON.stringify quotes them (as Go does here).
	if s := b.text(t, "#dead-letters tbody"); !strings.Contains(s, strconv.Quote(hostileKey)) {
		t.Errorf("dead letters page does not show the hostile key as text: %q", s)
	}
	pwned := eval[bool](t, b, `document.body.dataset.pwned !== undefined`)
	imgs := eval[int](t, b, `document.querySelectorAll("img, main script").length`)
	if pwned || imgs != 0 {
		t.Errorf("hostile input was interpreted: pwned %v, %d img/script elements", pwned, imgs)
	}
	b.screenshot(t, "dead-letters")

	// Unblock without the token: refused, the key stays blocked.
	b.open(t, keys, "keys", `document.querySelector("#blocked button.danger") !== null`)
	b.do(t, "unblocking without a token",
		void(chromedp.Evaluate[bool](`window.confirm = () => true; sessionStorage.removeItem("pgque-token"); true`)),
		chromedp.Click(chromedp.CSS(`#blocked button.danger`)),
		until(`!document.querySelector("#error").hidden`))
	if s := b.text(t, "#error"); !strings.Contains(s, "token") {
		t.Errorf("refused action shows %q", s)
	}
	if !w.blockedKey(t, stuckKey) {
		t.Fatal("an action without the token unblocked the key")
	}
	// With the token typed in: the key is unblocked.
	b.do(t, "unblocking with the token",
		chromedp.SendKeys(chromedp.CSS(`#token`), testToken),
		chromedp.Click(chromedp.CSS(`#blocked button.danger`)),
		until(`!document.querySelector("#notice").hidden`))
	pgtest.WaitFor(t, 10*time.Second, "tenant-stuck to be unblocked", func() bool { return !w.blockedKey(t, stuckKey) })
	b.do(t, "seeing the key unblocked", until(`!document.querySelector("#blocked").textContent.includes("tenant-stuck") && document.querySelector("#error").hidden`))
	b.screenshot(t, "keys-unblocked")

	// The read-only console shows no action and refuses one sent anyway.
	b.open(t, ro.URL+"/dlq?queue=files", "dlq", `document.querySelector("#mode").textContent === "read-only"`)
	// Each dead letter row has an inspect button, and nothing else.
	buttons := eval[int](t, b, `document.querySelectorAll("main button").length - document.querySelectorAll("#dead-letters tbody tr").length`)
	status := eval[int](t, b, `fetch("/api/actions/purge", {method: "POST", headers: {"Content-Type": "application/json", "X-Pgque-Token": "`+testToken+`"},
		body: JSON.stringify({queue: "files"})}).then((r) => r.status)`)
	if buttons > 0 || status != 403 {
		t.Errorf("read-only console: %d action buttons, POST answered %d (want none, 403)", buttons, status)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.requests) < 10 {
		t.Errorf("only %d requests were recorded", len(b.requests))
	}
	for _, u := range b.requests {
		if !strings.HasPrefix(u, rw.URL+"/") && !strings.HasPrefix(u, ro.URL+"/") {
			t.Errorf("a page loaded %s, outside the console", u)
		}
	}
	for _, m := range b.console {
		if strings.Contains(m, "Content Security Policy") || strings.Contains(m, "exception") {
			t.Errorf("browser console: %s", m)
		}
	}
}

// TestConsoleTokenInBrowser: a console that requires its token, opened
// once at /#token=<token> as pgque web prints it, reads its data on every
// page of the tab, with the token taken out of the address and no cookie
// set: a cookie would reach every port of the host, so whatever listens
// on another port of 127.0.0.1 would have the token. Without the token
// the page reports the refusal and reads nothing.
func TestConsoleTokenInBrowser(t *testing.T) {
	t.Parallel()
	b := startBrowser(t)
	client, err := pgque.NewClient(pgtest.Pool(t, pgtest.NewInstalledDB(t)), &pgque.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if _, err := client.CreateQueue(context.Background(), "tokenq"); err != nil {
		t.Fatal(err)
	}
	hs := serveConsole(t, Config{Client: client, Token: testToken, RequireToken: true, SampleInterval: 200 * time.Millisecond})

	b.do(t, "opening the console without its token", chromedp.Navigate(hs.URL+"/"),
		until(`!document.querySelector("#error").hidden && document.querySelector("#error").textContent.includes("requires its token")`))
	if s := b.text(t, "main"); strings.Contains(s, "tokenq") {
		t.Errorf("the page without the token shows %q", s)
	}

	b.open(t, hs.URL+"/#token="+testToken, "queues", `document.querySelector("#queues").textContent.includes("tokenq")`)
	if href := eval[string](t, b, `location.href`); strings.Contains(href, testToken) {
		t.Errorf("the token stayed in the address: %s", href)
	}
	b.open(t, hs.URL+"/consumers", "consumers", `document.querySelector("#error").hidden`)
	b.open(t, hs.URL+"/?token="+testToken, "queues", `document.querySelector("#queues").textContent.includes("tokenq")`)
	res, err := chromedp.Call(b.ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Cookies) != 0 {
		t.Errorf("the console set cookies: %v", res.Cookies)
	}
}
