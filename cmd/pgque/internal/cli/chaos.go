package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque/cmd/pgque/internal/chaos"
)

// chaosCommand runs a fault-injection run (internal/chaos; docs/chaos.md).
// Its flags are the chaos runner's own, so cobra passes them through
// untouched; the runner also re-executes this binary as `pgque chaos` to
// start its worker, producer and ticker processes.
func (a *app) chaosCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "chaos [flags]",
		Short: "Run workers, producers and faults against a throwaway Postgres and check G1/G2/G3 and no loss",
		Long: `Chaos starts a throwaway PostgreSQL (or uses -dsn), then producer, worker and
ticker processes while a scheduler injects faults (SIGKILL and SIGSTOP of
workers, Postgres immediate restarts, PgBouncer kills, ticker and producer
kills, online resizes, handler errors and panics, lease expiry). With
-ts-workers N, N TypeScript worker processes (Node.js 20+ and the package
built in clients/typescript: npm ci && npm run build) join the Go workers'
consumer under the same faults. At the end it checks the
recorded history for no loss, G1, G2 and G3 and prints a summary; the exit
code is 1 on any violation. 'pgque chaos -help' lists the flags; see
docs/chaos.md.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := chaos.Main(args); code != ExitOK {
				return &exitCodeError{code: code}
			}
			return nil
		},
	}
}

// exitCodeError ends the command with an exit code and no further message:
// the command has already said what went wrong.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }
