package cli

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque/cmd/pgque/internal/bench"
)

func (a *app) benchCommand() *cobra.Command {
	var (
		o      bench.Options
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run the benchmarks and print their ratios",
		Long: `Bench runs the benchmark suites (` + strings.Join(bench.SuiteNames(), ", ") + `) and prints
each figure with its reference and ratio, measured in one run on one cluster.
Without --dsn it starts a throwaway PostgreSQL from the local server binaries
(PGQUE_PG_VERSION=<major> or PGQUE_PG_BINDIR=<dir> choose another build, see
scripts/fetch-postgres; the report names the server version); with --dsn every suite works in its own fresh database on that server (the
role needs CREATEDB; $PGQUE_DSN and $DATABASE_URL are not used). report.json
and SVG charts go to --out ("-": none).`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range o.Suites {
				if !slices.Contains(bench.SuiteNames(), strings.TrimSpace(name)) {
					return usagef("unknown benchmark suite %q (known: %s)", name, strings.Join(bench.SuiteNames(), ", "))
				}
			}
			o.DSN = a.dsn // only an explicit --dsn: without it bench never touches a real server
			o.Progress = a.stderr
			rep, err := bench.Run(cmd.Context(), o)
			if asJSON && rep != nil {
				if jerr := a.printJSON(rep); jerr != nil && err == nil {
					err = jerr
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.Suites, "suite", nil, "run this suite (repeatable; default all): "+strings.Join(bench.SuiteNames(), ", "))
	f.BoolVar(&o.Quick, "quick", false, "shrink every suite so the whole run takes about two minutes")
	f.StringVar(&o.OutDir, "out", bench.OutDirDefault, `directory for report.json and the charts ("-": write nothing)`)
	f.StringVar(&o.UpstreamSQL, "upstream-sql", "", "also measure upstream PgQue in the steady, drain and wal suites, installed from this file "+
		"(e.g. git show v0.3.0-alpha.1:devel/sql/pgque.sql from its repository)")
	f.StringVar(&o.Only, "only", "", "run only the steady suite's configurations whose names match this regular expression (e.g. r2k_s16_go)")
	f.DurationVar(&o.HandlerTime, "handler-time", 0, "in the steady suite, make each Go handler take this long per event (e.g. 20ms), "+
		"as a handler doing real work; those configurations' names end in _h<ms>ms")
	f.DurationVar(&o.TickLag, "tick-lag", 0, "in the steady suite, set pgque's queues' ticker_max_lag to this (default 10ms): "+
		"fewer ticks, less CPU per event, more latency; those configurations' names end in _t<ms>ms")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON on stdout")
	return cmd
}
