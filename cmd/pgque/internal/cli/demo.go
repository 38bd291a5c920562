package cli

import (
	"errors"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque/cmd/pgque/internal/demo"
)

func (a *app) demoCommand() *cobra.Command {
	var (
		o       demo.Options
		asJSON  bool
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the multi-tenant file-event workload end to end and verify it",
		Long: `Demo starts a throwaway PostgreSQL (from the local server binaries; or uses
--dsn), installs pgque and runs the workload pgque was built for: producers
emit FileCreated / FileOverwritten / FileDeleted events for many tenants with
the tenant as partition key; a pool of worker processes (separate clients
with their own worker ids) sharing N slots applies them to a per-tenant state
table; a ticker runs beside them. Then it verifies that every event was
applied exactly once, in order per tenant, that the final state equals the
producers', that no two workers ever handled one tenant at once and that
nothing was dead-lettered, and prints throughput and latency percentiles
(send commit → handler start). It exits 0 only when every check passed.

With --failure-rate the handler fails that fraction of first deliveries
(before applying); the library retries them. Under the skip policy a retried
event may then be applied after later events of its tenant: the apply is
idempotent and order-insensitive, such reorders are counted and reported,
and only retried events may be reordered.

With --dsn the demo re-creates queue pgque_demo and schema pgque_demo in that
database and drops them after a passing run. Only an explicit --dsn counts:
$PGQUE_DSN and $DATABASE_URL are ignored, so that a plain 'pgque demo' never
writes into a real database.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return usagef("%v", err)
			}
			o.DSN = a.dsn // only an explicit --dsn: without it the demo never touches a real database
			o.Progress = a.stderr
			level := slog.LevelError
			if verbose {
				level = slog.LevelInfo
			}
			o.Logger = a.logger(level)
			if a.demoHook != nil {
				a.demoHook(&o)
			}
			res, err := demo.Run(cmd.Context(), o)
			if res != nil {
				if asJSON {
					if jerr := a.printJSON(res); jerr != nil {
						return jerr
					}
				} else {
					res.WriteSummary(a.stdout)
				}
			}
			if errors.Is(err, demo.ErrVerificationFailed) {
				return errors.New("demo: verification failed (see the checks above)")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Tenants, "tenants", demo.TenantsDefault, "number of tenants (partition keys)")
	f.IntVar(&o.Events, "events", demo.EventsDefault, "number of events to produce")
	f.IntVar(&o.Slots, "slots", demo.SlotsDefault, "number of slots N")
	f.IntVar(&o.Workers, "workers", demo.WorkersDefault, "number of worker processes sharing the slots")
	f.Float64Var(&o.FailureRate, "failure-rate", 0, "fraction of first deliveries the handler fails (retried by the library)")
	f.Float64Var(&o.Rate, "rate", 0, "cap production at this many events/s (0: as fast as possible)")
	f.DurationVar(&o.Duration, "duration", 0, "stop producing after this long (0: when --events are sent)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.BoolVarP(&verbose, "verbose", "v", false, "show the library's logs")
	return cmd
}
