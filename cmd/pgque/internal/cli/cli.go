package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes of Run.
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitFailure: a runtime error (database unreachable, unknown queue,
	// malformed input on stdin, failed demo verification, ...).
	ExitFailure = 1
	// ExitUsage: the command line itself is wrong (unknown command or flag,
	// wrong number of arguments, a flag value that does not parse, a
	// missing --yes).
	ExitUsage = 2
)

// Main runs the command line of the current process and returns its exit
// code: SIGINT and SIGTERM cancel the command's context (long-running
// commands then stop cleanly); a second signal kills the process.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // restore the default handlers: a second Ctrl-C kills
	}()
	return Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

// Run runs the pgque command line given by args (without the program name)
// and returns the exit code (ExitOK, ExitFailure or ExitUsage). Output goes
// to stdout; errors go to stderr as one line "pgque: <error>". Cancelling
// ctx stops long-running commands (ticker, tail, status --watch, demo)
// cleanly; they then exit with ExitOK.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return newApp(stdin, stdout, stderr).run(ctx, args)
}

// EnvDebug, when set to a non-empty value, makes an internal error (a panic
// in a command) print its stack trace too.
const EnvDebug = "PGQUE_DEBUG"

// run executes args and maps the outcome to an exit code. A panic in a
// command is an internal error: one line (and the stack with $PGQUE_DEBUG),
// exit 1.
func (a *app) run(ctx context.Context, args []string) (code int) {
	stderr := a.stderr
	defer func() {
		if v := recover(); v != nil {
			fmt.Fprintf(stderr, "pgque: internal error: %s (set %s=1 for the stack trace)\n", oneLine(fmt.Sprint(v)), EnvDebug)
			if os.Getenv(EnvDebug) != "" {
				fmt.Fprintf(stderr, "%s", debug.Stack())
			}
			code = ExitFailure
		}
	}()
	root := a.rootCommand()
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ce *exitCodeError
	if errors.As(err, &ce) {
		return ce.code
	}
	var ue *usageError
	if !a.ran || errors.As(err, &ue) {
		path := root.Name()
		if cmd != nil {
			path = cmd.CommandPath()
		}
		fmt.Fprintf(stderr, "pgque: %s (see '%s --help')\n", oneLine(err.Error()), path)
		return ExitUsage
	}
	fmt.Fprintf(stderr, "pgque: %s\n", oneLine(err.Error()))
	return ExitFailure
}

// New returns the root command writing to stdout and stderr and reading
// stdin from os.Stdin, for callers that drive cobra themselves (for
// instance to generate documentation). Prefer Run, which also maps errors to
// exit codes and prints them.
func New(stdout, stderr io.Writer) *cobra.Command {
	return newApp(os.Stdin, stdout, stderr).rootCommand()
}

// usageError is a mistake in the command line, found while the command was
// already running (cobra reports the others itself).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef returns a usage error: Run prints it with a pointer to --help and
// exits with ExitUsage.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// oneLine folds a multi-line error message into one line, so every error is
// a single line on stderr.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	return strings.Join(fields, "; ")
}
