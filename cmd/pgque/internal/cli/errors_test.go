package cli

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/cmd/pgque/internal/demo"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// unreachable is a DSN no server listens on.
const unreachable = "host=/nonexistent port=1 connect_timeout=5"

// checkOneLine fails unless r failed with code, printing nothing on stdout
// and exactly one line "pgque: ..." containing want on stderr: never a
// usage dump, a stack trace or a panic.
func checkOneLine(t *testing.T, args []string, r result, code int, want string) {
	t.Helper()
	line := strings.TrimSuffix(r.stderr, "\n")
	switch {
	case r.code != code:
		t.Errorf("pgque %s: exit %d, want %d\n%v", strings.Join(args, " "), r.code, code, r)
	case r.stdout != "":
		t.Errorf("pgque %s: printed on stdout %q, want nothing", strings.Join(args, " "), r.stdout)
	case strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(line, "pgque: "):
		t.Errorf("pgque %s: stderr %q, want one line \"pgque: ...\"", strings.Join(args, " "), r.stderr)
	case strings.Contains(line, "goroutine ") || strings.Contains(line, "panic"):
		t.Errorf("pgque %s: stderr looks like a crash: %q", strings.Join(args, " "), line)
	case !strings.Contains(line, want):
		t.Errorf("pgque %s: stderr %q, want it to mention %q", strings.Join(args, " "), line, want)
	}
}

// TestUsageErrors: a wrong command line exits 2 with one line pointing to
// --help, without touching any database.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"queue"}, "needs a subcommand"},
		{[]string{"queue", "bogus"}, `unknown command "bogus"`},
		{[]string{"dlq"}, "needs a subcommand"},
		{[]string{"slots", "bogus"}, `unknown command "bogus"`},
		{[]string{"queue", "list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"install", "extra"}, "expects no arguments"},
		{[]string{"queue", "create"}, "expects <queue>"},
		{[]string{"queue", "create", "a", "b"}, "expects <queue>"},
		{[]string{"queue", "create", ""}, "<queue> must not be empty"},
		{[]string{"queue", "create", "q", "--set", "max_retries"}, "want param=value"},
		{[]string{"queue", "drop", "q"}, "pass --yes"},
		{[]string{"subscribe", "q"}, "--consumer is required"},
		{[]string{"subscribe", "q", "c", "--consumer", "d"}, "the consumer is given twice"},
		{[]string{"subscribe", "q", "c", "d"}, "expects <queue> [consumer]"},
		{[]string{"slots", "subscribe", "q", "--slots", "2"}, "--consumer is required"},
		{[]string{"slots", "subscribe", "q", "--consumer", "c"}, `"slots" not set`},
		{[]string{"slots", "subscribe", "q", "--consumer", "c", "--slots", "0"}, "--slots must be at least 1"},
		{[]string{"slots", "subscribe", "q", "--consumer", "c", "--slots", "x"}, "invalid argument"},
		{[]string{"slots", "policy", "q", "halt", "--consumer", "c"}, "must be skip or pause"},
		{[]string{"slots", "policy", "q", "pause"}, `"consumer" not set`},
		{[]string{"slots", "unblock", "q", "--consumer", "c", "--key", "k", "--null-key"}, "not both"},
		{[]string{"send"}, "expects <queue> [payload]"},
		{[]string{"send", "q", "{bad"}, "not valid JSON"},
		{[]string{"send", "q", "1 2"}, "not valid JSON"},
		{[]string{"tail", "q", "--slot", "3/8"}, "--slot needs --consumer"},
		{[]string{"tail", "q", "--consumer", "c", "--slot", "8/8"}, "want k/N"},
		{[]string{"tail", "q", "--consumer", "c", "--slot", "x"}, "want k/N"},
		{[]string{"tail", "q", "--max", "-1"}, "--max must not be negative"},
		{[]string{"tail", "q", "--timeout", "soon"}, "invalid argument"},
		{[]string{"status", "a", "b"}, "expects [queue]"},
		{[]string{"dlq", "replay", "q"}, "or pass --all"},
		{[]string{"dlq", "replay", "q", "1", "--all"}, "not both"},
		{[]string{"dlq", "replay", "q", "x"}, `"x" is not a number`},
		{[]string{"dlq", "purge", "q"}, "pass --yes"},
		{[]string{"uninstall"}, "pass --yes"},
		{[]string{"demo", "--tenants", "many"}, "invalid argument"},
		{[]string{"demo", "--failure-rate", "1.5"}, "--failure-rate must be in [0, 1)"},
		{[]string{"bench", "--suite", "bogus"}, `unknown benchmark suite "bogus"`},
		{[]string{"queue", "list", "--dsn", "host=x port=notaport"}, "--dsn"},
	}
	for _, tc := range cases {
		r := execIn(context.Background(), nil, "", tc.args...)
		checkOneLine(t, tc.args, r, ExitUsage, tc.want)
		if !strings.Contains(r.stderr, "--help") {
			t.Errorf("pgque %s: stderr %q does not point to --help", strings.Join(tc.args, " "), r.stderr)
		}
	}
	if os.Getenv(EnvDSN) == "" && os.Getenv(EnvDatabaseURL) == "" {
		r := execIn(context.Background(), nil, "", "queue", "list")
		checkOneLine(t, []string{"queue", "list"}, r, ExitUsage, "no database given")
	}
}

// TestUnreachableDatabase: every command that needs the database fails
// with one line naming the connection problem, exit 1.
func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	commands := [][]string{
		{"install"}, {"upgrade"}, {"uninstall", "--yes"}, {"version", "--json"},
		{"ticker"},
		{"queue", "create", "q"}, {"queue", "drop", "q", "--yes"}, {"queue", "list"}, {"queue", "config", "q"},
		{"subscribe", "q", "c"}, {"unsubscribe", "q", "c"},
		{"slots", "subscribe", "q", "--consumer", "c", "--slots", "2"}, {"slots", "status"},
		{"slots", "policy", "q", "pause", "--consumer", "c"}, {"slots", "blocked", "q"},
		{"slots", "unblock", "q", "--consumer", "c", "--key", "k"}, {"slots", "retry-now", "q", "--consumer", "c", "--null-key"},
		{"send", "q", "{}"}, {"tail", "q"}, {"status"}, {"status", "--watch"},
		{"dlq", "list", "q"}, {"dlq", "replay", "q", "1"}, {"dlq", "purge", "q", "--yes"},
		{"demo"},
	}
	for _, args := range commands {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r := execIn(ctx, nil, "", append(args, "--dsn", unreachable)...)
		cancel()
		checkOneLine(t, args, r, ExitFailure, "/nonexistent")
	}
}

// TestRuntimeErrors: bad input that only the database can judge fails with
// one line and exit 1, and sends nothing.
func TestRuntimeErrors(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, dsn: pgtest.NewInstalledDB(t)}
	c.ok("", "queue", "create", "q")
	c.ok("", "slots", "subscribe", "q", "--consumer", "c", "--slots", "4")

	cases := []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"send", "nope", "{}"}, "queue 'nope' does not exist"},
		{"", []string{"queue", "config", "nope"}, "does not exist"},
		{"", []string{"queue", "config", "q", "--set", "bogus=1"}, "SQLSTATE PQ012"},
		{"", []string{"queue", "config", "q", "--set", "max_retries=-1"}, "SQLSTATE PQ011"},
		{"", []string{"queue", "create", "bad#name"}, "SQLSTATE PQ010"},
		{"", []string{"queue", "drop", "nope", "--yes"}, "does not exist"},
		{"", []string{"subscribe", "nope", "c"}, "SQLSTATE PQ001"},
		{"", []string{"slots", "subscribe", "q", "--consumer", "c", "--slots", "8"}, "SQLSTATE PQ030"},
		{"", []string{"slots", "status", "nope"}, "SQLSTATE PQ001"},
		{"", []string{"tail", "nope"}, "SQLSTATE PQ001"},
		{"", []string{"tail", "q", "--consumer", "nobody"}, "SQLSTATE PQ002"},
		{"", []string{"tail", "q", "--consumer", "c", "--slot", "1/8"}, `consumer "c" of queue "q" has 4 slots, not 8`},
		{"", []string{"tail", "q", "--consumer", "c"}, `consumer "c" of queue "q" is a partitioned consumer with 4 slots: read one slot with --slot k/4`},
		{"", []string{"status", "nope"}, "SQLSTATE PQ001"},
		{"", []string{"dlq", "list", "nope"}, "SQLSTATE PQ001"},
		{"", []string{"dlq", "replay", "q", "42"}, "SQLSTATE PQ040"},
		{"{\"ok\":1}\n{\"ok\":2}\n{bad json}\n{\"ok\":4}\n", []string{"send", "q", "--key", "k"}, "stdin line 3: invalid JSON"},
		{"{\"ok\":1}\n\n[1,2] 3\n", []string{"send", "q"}, "stdin line 3: invalid JSON"},
		{"{\"payload\":{}}\n{\"key\":\"k\"}\n", []string{"send", "q", "--envelope"}, `stdin line 2: not an envelope object: "payload" is missing`},
		{"{\"payload\":{},\"color\":1}\n", []string{"send", "q", "--envelope"}, "stdin line 1: not an envelope object"},
	}
	for _, tc := range cases {
		r := c.exec(tc.stdin, tc.args...)
		checkOneLine(t, tc.args, r, ExitFailure, tc.want)
	}
	var n int
	if err := c.conn().QueryRow(context.Background(), `select count(*) from pgque.event`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d events were sent by commands that failed", n)
	}

	empty := &cli{t: t, dsn: pgtest.NewDB(t)}
	for _, args := range [][]string{{"queue", "list"}, {"send", "q", "{}"}, {"status"}} {
		checkOneLine(t, args, empty.exec("", args...), ExitFailure, "pgque is not installed")
	}
}

// TestPanicIsOneLine: an internal error (a panic in a command) is still one
// line on stderr and exit 1.
func TestPanicIsOneLine(t *testing.T) {
	t.Parallel()
	hook := func(a *app) {
		a.demoHook = func(*demo.Options) { panic("boom\nsecond line") }
	}
	r := execIn(context.Background(), hook, "", "demo", "--dsn", unreachable)
	checkOneLine(t, []string{"demo"}, r, ExitFailure, "internal error: boom; second line")
}
