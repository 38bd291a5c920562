package chaos

import (
	"context"
	"flag"
	"fmt"
	"github.com/pgque/pgque/internal/pgbouncer"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// Main is the entry point of both sides of a chaos run; it returns the
// process exit code.
//
// Started by the runner (EnvRole set), it becomes a worker, producer or
// ticker process and ignores args. Otherwise args are the runner's flags
// (see -help): it runs a chaos test, prints the summary table and returns
// 0 when no guarantee was violated, 1 on a violation or a harness error,
// 2 on bad flags.
//
// A binary offers chaos by calling Main from a command that receives the
// re-executed processes too: the runner starts Options.ProcCommand, by
// default its own executable with the single argument "chaos" and the
// environment variables EnvRole and EnvConfig set. The pgque CLI wires
// `pgque chaos [flags]` (flag parsing disabled in cobra) to Main(flags);
// internal/chaos/cmd/chaosproc is a standalone binary that does the same.
func Main(args []string) int {
	if IsProc() {
		cfg, err := procFromEnv()
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		return runProc(cfg, os.Stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return mainRun(ctx, args, os.Stdout, os.Stderr)
}

func mainRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := DefaultOptions()
	o := d
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.DSN, "dsn", "", "existing database (default: a throwaway cluster; Postgres restarts need it)")
	fs.DurationVar(&o.Duration, "duration", d.Duration, "length of the fault phase")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", d.DrainTimeout, "how long workers may drain after the producers stop")
	fs.IntVar(&o.Producers, "producers", d.Producers, "producer processes")
	fs.IntVar(&o.Workers, "workers", d.Workers, "Go worker processes")
	fs.IntVar(&o.TSWorkers, "ts-workers", 0, "TypeScript worker processes (Node.js 20+, the package built: cd clients/typescript && npm ci && npm run build) beside the Go ones, on the same consumer")
	fs.StringVar(&o.TSWorkerScript, "ts-worker", DefaultTSWorkerScript, "the built TypeScript chaos worker script, for -ts-workers")
	fs.IntVar(&o.Slots, "slots", d.Slots, "slots (N)")
	fs.IntVar(&o.Keys, "keys", d.Keys, "distinct partition keys")
	fs.Float64Var(&o.Rate, "rate", d.Rate, "events per second over all producers")
	fs.StringVar(&o.Policy, "policy", d.Policy, "failure policy: pause or skip")
	fs.DurationVar(&o.LeaseTTL, "lease-ttl", d.LeaseTTL, "slot lease TTL")
	fs.DurationVar(&o.RetryDelay, "retry-delay", d.RetryDelay, "first retry delay (grows linearly)")
	fs.IntVar(&o.MaxRetries, "max-retries", d.MaxRetries, "queue max_retries")
	fs.IntVar(&o.BatchSize, "batch-size", d.BatchSize, "events per chunk")
	fs.IntVar(&o.Lanes, "lanes", d.Lanes, "handlers per slot at once (key lanes; 1: one event at a time)")
	fs.Float64Var(&o.ErrorRate, "error-rate", d.ErrorRate, "share of handler runs returning an error")
	fs.Float64Var(&o.PanicRate, "panic-rate", d.PanicRate, "share of handler runs panicking")
	fs.Float64Var(&o.SlowRate, "slow-rate", d.SlowRate, "share of handler runs outliving the lease TTL")
	fs.DurationVar(&o.SleepMax, "sleep-max", d.SleepMax, "longest ordinary handler run")
	fs.Float64Var(&o.PoisonPct, "poison-pct", d.PoisonPct, "percent of events that always fail")
	fs.BoolVar(&o.Tx, "tx", d.Tx, "handlers run as HandlerTx, writing one effect row each in their transaction; check exactly-once effects")
	fs.DurationVar(&o.FaultInterval, "fault-interval", d.FaultInterval, "mean time between faults")
	faults := fs.String("faults", strings.Join(AllFaults, ","), "fault kinds to inject, comma-separated (empty: none)")
	bouncer := fs.Bool("pgbouncer", true, "put half of the workers behind PgBouncer (when installed)")
	fs.StringVar(&o.RunDir, "run-dir", "", "directory for records, logs and summary.json (default: a temporary one, kept on failure)")
	seed := fs.Uint64("seed", 0, "seed of the fault scheduler (0: from the clock)")
	recheck := fs.String("recheck", "", "check the run directory of a finished run again instead of running")
	key := fs.String("key", "", "with -recheck: print the timeline of this key")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *recheck != "" {
		h, rep, err := Recheck(*recheck)
		if err != nil {
			fmt.Fprintf(stderr, "chaos: %v\n", err)
			return 1
		}
		if *key != "" {
			PrintKey(stdout, h, *key)
		}
		if rep == nil {
			fmt.Fprintf(stderr, "chaos: %s has no %s: timelines only, no verdict\n", *recheck, truthFile)
			return 1
		}
		PrintSummary(stdout, &Summary{Policy: h.Policy, Report: rep, RunDir: *recheck, Faults: map[string]int{}, Tx: h.Tx})
		if !rep.OK() {
			return 1
		}
		return 0
	}
	if o.TSWorkers < 0 {
		fmt.Fprintf(stderr, "chaos: -ts-workers must be 0 or more, not %d\n", o.TSWorkers)
		return 2
	}
	if o.Policy != "pause" && o.Policy != "skip" {
		fmt.Fprintf(stderr, "chaos: -policy must be pause or skip, not %q\n", o.Policy)
		return 2
	}
	o.Faults = []string{}
	for _, f := range strings.Split(*faults, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		known := false
		for _, k := range AllFaults {
			known = known || k == f
		}
		if !known {
			fmt.Fprintf(stderr, "chaos: unknown fault %q (known: %s)\n", f, strings.Join(AllFaults, ","))
			return 2
		}
		o.Faults = append(o.Faults, f)
	}
	if _, err := os.Stat(pgbouncer.Path); err != nil {
		*bouncer = false
	}
	o.PgBouncer = bouncer
	o.Seed = *seed
	o.Out = stdout
	start := time.Now()
	sum, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "chaos: %v (after %v)\n", err, time.Since(start).Round(time.Second))
		return 1
	}
	if !sum.OK() {
		return 1
	}
	return 0
}
