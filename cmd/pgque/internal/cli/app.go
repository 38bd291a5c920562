package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/demo"
)

// Environment variables that name the database when --dsn is not given, in
// order of preference.
const (
	EnvDSN         = "PGQUE_DSN"
	EnvDatabaseURL = "DATABASE_URL"
)

// app is one invocation of the command line: its streams and global flags.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	dsn string // --dsn
	// ran is set once a command's own code starts: every error cobra
	// returns before that is a usage error.
	ran bool

	// demoHook, set by tests, adjusts the demo's options before it runs.
	demoHook func(*demo.Options)
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *app {
	return &app{stdin: stdin, stdout: stdout, stderr: stderr}
}

// rootCommand builds the command tree.
func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "pgque",
		Short: "An ordered event log with partition keys, inside PostgreSQL",
		Long: `pgque is an ordered, immutable event log inside PostgreSQL with partition
keys: events that share a key are consumed in order by one worker at a time,
events with different keys in parallel.

Every command that talks to a database takes --dsn (a libpq connection string
or postgres:// URL); without it, PGQUE_DSN and then DATABASE_URL are used.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &usageError{msg: err.Error()}
	})
	root.PersistentFlags().StringVar(&a.dsn, "dsn", "",
		"database to use (default $"+EnvDSN+", then $"+EnvDatabaseURL+")")
	root.AddCommand(
		a.installCommand(), a.upgradeCommand(), a.uninstallCommand(), a.sqlCommand(), a.versionCommand(),
		a.tickerCommand(),
		a.queueCommand(), a.subscribeCommand(), a.unsubscribeCommand(), a.slotsCommand(),
		a.sendCommand(), a.tailCommand(), a.statusCommand(), a.dlqCommand(), a.keysCommand(), a.webCommand(),
		a.demoCommand(), a.benchCommand(), a.chaosCommand(),
		a.relayCommand(),
	)
	a.markRuns(root)
	return root
}

// markRuns wraps every command's RunE so that it records that the command
// started: cobra has validated the command line by then (arguments,
// flags, required flags), so any error cobra returns without it is a usage
// error.
func (a *app) markRuns(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			a.ran = true
			return run(cmd, args)
		}
	}
	for _, sub := range cmd.Commands() {
		a.markRuns(sub)
	}
}

// group returns a command that only holds subcommands: run without one (or
// with an unknown one), it is a usage error.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, c.Name())
				}
			}
			if len(args) == 0 {
				return usagef("%s needs a subcommand: %s", cmd.CommandPath(), strings.Join(names, ", "))
			}
			return usagef("unknown command %q for %q (known: %s)", args[0], cmd.CommandPath(), strings.Join(names, ", "))
		},
	}
	cmd.AddCommand(subs...)
	return cmd
}

// exactArgs accepts exactly the named positional arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == len(names) {
			for i, arg := range args {
				if arg == "" {
					return fmt.Errorf("<%s> must not be empty", names[i])
				}
			}
			return nil
		}
		want := "no arguments"
		if len(names) > 0 {
			want = "<" + strings.Join(names, "> <") + ">"
		}
		return fmt.Errorf("%s expects %s, got %d argument(s)", subPath(cmd), want, len(args))
	}
}

// rangeArgs accepts the required names and then up to len(optional) more.
func rangeArgs(required []string, optional ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) >= len(required) && len(args) <= len(required)+len(optional) {
			return nil
		}
		want := ""
		if len(required) > 0 {
			want = "<" + strings.Join(required, "> <") + ">"
		}
		for _, o := range optional {
			want += " [" + o + "]"
		}
		return fmt.Errorf("%s expects %s, got %d argument(s)", subPath(cmd), strings.TrimSpace(want), len(args))
	}
}

// subPath is the command's path without the program name: "queue create".
func subPath(cmd *cobra.Command) string {
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

// defaultWorkerID is hostname-pid-random, unique per process and readable
// in leases.
func defaultWorkerID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", sanitizeName(host), os.Getpid(), randomHex(4))
}

// resolveDSN returns --dsn, else $PGQUE_DSN, else $DATABASE_URL.
func (a *app) resolveDSN() (string, error) {
	for _, dsn := range []string{a.dsn, os.Getenv(EnvDSN), os.Getenv(EnvDatabaseURL)} {
		if strings.TrimSpace(dsn) != "" {
			return dsn, nil
		}
	}
	return "", usagef("no database given: pass --dsn, or set %s or %s", EnvDSN, EnvDatabaseURL)
}

// openPool opens and pings a pool on the resolved DSN.
func (a *app) openPool(ctx context.Context) (*pgxpool.Pool, error) {
	dsn, err := a.resolveDSN()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("--dsn: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	return pool, nil
}

// session is an open connection to a database with pgque installed: the
// public Client for what it offers, and the SQL layers for the rest.
type session struct {
	*pgque.Client
	pool *pgxpool.Pool
}

// Close closes the pool.
func (s *session) Close() { s.pool.Close() }

// connect opens a pool, checks that pgque is installed, and returns a
// session. The client polls instead of holding a LISTEN session: short
// commands have nothing to wait for.
func (a *app) connect(ctx context.Context) (*session, error) {
	return a.connectWith(ctx, &pgque.Config{Logger: a.logger(slog.LevelWarn), PollOnly: true})
}

// connectWith is connect with the client's configuration.
func (a *app) connectWith(ctx context.Context, config *pgque.Config) (*session, error) {
	pool, err := a.openPool(ctx)
	if err != nil {
		return nil, err
	}
	c, err := pgque.NewClient(pool, config)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if err := c.CheckSchema(ctx); err != nil {
		pool.Close()
		if errors.Is(err, pgque.ErrNotInstalled) {
			return nil, errors.New("pgque is not installed in this database (run 'pgque install')")
		}
		return nil, err
	}
	return &session{Client: c, pool: pool}, nil
}

// logger returns a text logger on stderr at level.
func (a *app) logger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
}

// printJSON writes v as indented JSON on stdout.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one line of JSON on stdout, for streams.
func (a *app) printJSONLine(v any) error {
	return json.NewEncoder(a.stdout).Encode(v)
}
