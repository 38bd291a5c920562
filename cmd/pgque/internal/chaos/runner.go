package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgbouncer"
	"github.com/pgque/pgque/internal/pgcluster"
)

// Options configures Run. Zero durations, counts, Rate and Policy take the
// defaults of DefaultOptions; zero rates of injected failures mean none, so
// start from DefaultOptions() to get them.
type Options struct {
	// DSN is an existing database to run in (pgque is installed into it).
	// Empty starts a throwaway cluster. Postgres restarts need the
	// throwaway cluster and are skipped with a DSN.
	DSN string
	// Duration of the fault phase. Producers stop after it; workers then
	// drain for at most DrainTimeout.
	Duration     time.Duration
	DrainTimeout time.Duration

	Producers int // producer processes
	Workers   int // Go worker processes
	// TSWorkers is the number of TypeScript worker processes (Node.js,
	// the package's work()) beside the Go ones, on the same consumer and
	// under the same faults (tsworker.go). Run fails when Node.js or the
	// built package is missing.
	TSWorkers int
	// TSWorkerScript is the compiled TypeScript chaos worker (default
	// DefaultTSWorkerScript, relative to the working directory).
	TSWorkerScript string
	Slots          int     // N
	Keys           int     // distinct partition keys
	Rate           float64 // events per second, all producers together
	Policy         string  // "pause" (default) or "skip"

	LeaseTTL   time.Duration // slot lease TTL (short: expiry under load)
	RetryDelay time.Duration // first retry delay; grows linearly
	MaxRetries int           // queue max_retries before dead-lettering
	BatchSize  int
	// Lanes is how many handlers a worker runs at once per slot (key
	// lanes, PartitionedConsumerConfig.MaxWorkersPerSlot); 1 is one event
	// at a time per slot.
	Lanes int
	// Tx runs the handlers as HandlerTx, each writing one effect row in its
	// transaction, and checks that every committed event's effect exists
	// exactly once (GuaranteeEffects).
	Tx        bool
	ErrorRate float64 // share of handler runs that return an error
	PanicRate float64 // share that panic
	SlowRate  float64 // share that outlive the lease TTL (renewal in the background)
	SleepMax  time.Duration
	PoisonPct float64 // percent of events that always fail (dead letters)

	// Faults lists the fault kinds to inject (Fault* constants); nil means
	// every kind available. FaultInterval is the mean time between faults;
	// the first faults go round every kind once, then kinds are drawn at
	// random.
	Faults        []string
	FaultInterval time.Duration
	// PgBouncer puts half of the workers behind a PgBouncer in transaction
	// mode (default true when /usr/sbin/pgbouncer exists).
	PgBouncer *bool

	// RunDir receives the records, the logs and summary.json. Empty: a new
	// temporary directory, removed after a run without violations.
	RunDir string
	// ProcCommand is the command that becomes a chaos process when EnvRole
	// is set; default: this executable with the argument "chaos".
	ProcCommand []string
	// Out receives progress lines and the summary table (default
	// os.Stdout).
	Out io.Writer
	// Seed seeds the fault scheduler (0: from the clock).
	Seed uint64
}

// DefaultOptions is a ten-minute run with every fault.
func DefaultOptions() Options {
	return Options{
		Duration: 10 * time.Minute, DrainTimeout: 2 * time.Minute,
		Producers: 2, Workers: 4, Slots: 8, Keys: 64, Rate: 150, Policy: "pause",
		LeaseTTL: 2 * time.Second, RetryDelay: 100 * time.Millisecond, MaxRetries: 3, BatchSize: 10, Lanes: 4,
		ErrorRate: 0.03, PanicRate: 0.01, SlowRate: 0.002, SleepMax: 5 * time.Millisecond, PoisonPct: 0.5,
		FaultInterval: 5 * time.Second,
	}
}

// AllFaults are the fault kinds the scheduler injects.
var AllFaults = []string{FaultWorkerKill, FaultWorkerStop, FaultPGRestart, FaultPgBouncerKill, FaultTickerKill, FaultProducerKill, FaultResize}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	set := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	set(&o.Duration, d.Duration)
	set(&o.DrainTimeout, d.DrainTimeout)
	set(&o.LeaseTTL, d.LeaseTTL)
	set(&o.RetryDelay, d.RetryDelay)
	set(&o.SleepMax, d.SleepMax)
	set(&o.FaultInterval, d.FaultInterval)
	seti := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	seti(&o.Producers, d.Producers)
	seti(&o.Workers, d.Workers)
	seti(&o.Slots, d.Slots)
	seti(&o.Keys, d.Keys)
	seti(&o.MaxRetries, d.MaxRetries)
	seti(&o.BatchSize, d.BatchSize)
	seti(&o.Lanes, d.Lanes)
	if o.Rate == 0 {
		o.Rate = d.Rate
	}
	if o.Policy == "" {
		o.Policy = d.Policy
	}
	if o.Faults == nil {
		o.Faults = AllFaults
	}
	if o.PgBouncer == nil {
		_, err := os.Stat(pgbouncer.Path)
		v := err == nil
		o.PgBouncer = &v
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	return o
}

// Summary is the outcome of a run.
type Summary struct {
	Policy   string         `json:"policy"`
	Duration time.Duration  `json:"duration"`
	Drained  bool           `json:"drained"`
	Faults   map[string]int `json:"faults"`
	// SlotEpochs is the sum of the slots' lease epochs at the end: every
	// claim of a free or expired lease adds one.
	SlotEpochs int64 `json:"slot_epochs"`
	// Fencings counts "slot fenced" warnings in the workers' logs: a worker
	// found its lease lost (expired locally, or another epoch on renewal)
	// and cancelled the slot's handlers.
	Fencings int `json:"fencings"`
	// Claims counts the leases the workers logged as granted (TSClaims
	// those of TypeScript workers): what tells the checker when an epoch
	// that handed out nothing more began.
	Claims   int     `json:"claims"`
	TSClaims int     `json:"ts_claims,omitempty"`
	Report   *Report `json:"report"`
	// Workers and TSWorkers are the Go and TypeScript worker processes;
	// TSSuccesses counts the handler successes of TypeScript workers and
	// TSKills the worker kills that hit one.
	Workers     int `json:"workers"`
	TSWorkers   int `json:"ts_workers,omitempty"`
	TSSuccesses int `json:"ts_successes,omitempty"`
	TSKills     int `json:"ts_kills,omitempty"`
	// Tx: the handlers ran in transactions (Options.Tx).
	Tx     bool   `json:"tx,omitempty"`
	RunDir string `json:"run_dir"`
}

// OK reports whether the run violated nothing.
func (s *Summary) OK() bool { return s.Report != nil && s.Report.OK() }

const (
	queueName    = "chaos"
	consumerName = "chaosc"
	dbName       = "chaos"
)

// runner is one run's state.
type runner struct {
	o       Options
	out     io.Writer
	dir     string
	cluster *pgcluster.Cluster
	dsn     string // direct
	bouncer *pgbouncer.Bouncer
	rng     *rand.Rand

	mu     sync.Mutex
	procs  map[string]*proc // by role+index slot name, current incarnation
	faults []Fault
	flog   *os.File
	incarn map[string]int
	// tsCommand starts a TypeScript worker (Options.TSWorkers > 0).
	tsCommand []string
	picks     map[string]int // workers picked per fault kind so far (pickWorker)
	ending    bool           // no more restarts of crashed processes
}

// proc is one incarnation of a chaos process.
type proc struct {
	id, role, slot string
	cmd            *exec.Cmd
	done           chan struct{}
	expectExit     bool // killed or stopped by the runner
}

// Run runs a chaos test and checks its history. The error is for the
// harness failing (no cluster, install failed); violations are in the
// Summary.
func Run(ctx context.Context, opts Options) (*Summary, error) {
	o := opts.withDefaults()
	r := &runner{o: o, out: o.Out, procs: map[string]*proc{}, incarn: map[string]int{}}
	seed := o.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	r.rng = rand.New(rand.NewPCG(seed, 7))
	var err error
	if o.TSWorkers > 0 {
		if r.tsCommand, err = tsWorkerCommand(o.TSWorkerScript); err != nil {
			return nil, err
		}
	}
	r.dir = o.RunDir
	tempDir := r.dir == ""
	if tempDir {
		if r.dir, err = os.MkdirTemp("", "pgque-chaos-"); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"records", "logs"} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if r.flog, err = os.OpenFile(filepath.Join(r.dir, "faults.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, err
	}
	defer r.flog.Close()
	r.logf("chaos: run directory %s (seed %d)", r.dir, seed)

	if err := r.setupDB(ctx); err != nil {
		r.teardown()
		return nil, err
	}
	sum, err := r.run(ctx)
	r.teardown()
	if err != nil {
		return nil, err
	}
	sum.RunDir = r.dir
	if b, err := json.MarshalIndent(sum, "", "  "); err == nil {
		_ = os.WriteFile(filepath.Join(r.dir, "summary.json"), b, 0o644)
	}
	PrintSummary(r.out, sum)
	if tempDir && sum.OK() {
		_ = os.RemoveAll(r.dir)
		sum.RunDir = ""
	}
	return sum, nil
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.out, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// setupDB starts the cluster (or uses the DSN), installs pgque and creates
// the queue, the slots, the failure policy and the chaos_sent table.
func (r *runner) setupDB(ctx context.Context) error {
	if r.o.DSN == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{
			"max_connections": "500",
			// Slow statements go to the server log, kept with the run.
			"log_min_duration_statement": "1s",
		}})
		if err != nil {
			return err
		}
		r.cluster = c
		if r.dsn, err = c.CreateDatabase(ctx, dbName); err != nil {
			return err
		}
	} else {
		r.dsn = r.o.DSN
		r.o.Faults = slices.DeleteFunc(slices.Clone(r.o.Faults), func(k string) bool { return k == FaultPGRestart })
		*r.o.PgBouncer = false // the bouncer needs a socket directory we know
	}
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := install.Install(ctx, conn); err != nil {
		return fmt.Errorf("installing pgque: %w", err)
	}
	stmts := []string{
		`drop table if exists chaos_sent`,
		`create table chaos_sent (key text not null, seq bigint not null, ev_id bigint primary key)`,
		`create index on chaos_sent (key, seq)`,
		// Tx runs: one row per committed handler transaction, no unique
		// constraint, so that a second application would show.
		`drop table if exists chaos_effects`,
		`create table chaos_effects (ev_id bigint not null, proc text not null, epoch bigint not null)`,
		fmt.Sprintf(`select pgque.drop_queue('%s', true) from pgque.queue where queue_name = '%s'`, queueName, queueName),
		fmt.Sprintf(`select pgque.create_queue('%s')`, queueName),
		fmt.Sprintf(`select pgque.set_queue_config('%s', 'max_retries', '%d')`, queueName, r.o.MaxRetries),
		fmt.Sprintf(`select pgque.set_queue_config('%s', 'ticker_max_count', '50')`, queueName),
		fmt.Sprintf(`select pgque.set_queue_config('%s', 'rotation_period', '20 seconds')`, queueName),
		fmt.Sprintf(`select pgque.subscribe_slot('%s', '%s', s, %d) from generate_series(0, %d) s`, queueName, consumerName, r.o.Slots, r.o.Slots-1),
		fmt.Sprintf(`select pgque.set_failure_policy('%s', '%s', '%s')`, queueName, consumerName, r.o.Policy),
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	if *r.o.PgBouncer {
		b, err := pgbouncer.New(pgbouncer.Options{Host: r.cluster.Host(), Port: r.cluster.Port(), User: pgcluster.Superuser})
		if err != nil {
			return err
		}
		if err := b.Start(ctx); err != nil {
			return err
		}
		r.bouncer = b
	} else {
		r.o.Faults = slices.DeleteFunc(slices.Clone(r.o.Faults), func(k string) bool { return k == FaultPgBouncerKill })
	}
	return nil
}

func (r *runner) teardown() {
	r.mu.Lock()
	r.ending = true
	procs := make([]*proc, 0, len(r.procs))
	for _, p := range r.procs {
		procs = append(procs, p)
	}
	r.mu.Unlock()
	for _, p := range procs {
		p.expectExit = true
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if r.bouncer != nil {
		r.bouncer.Remove(filepath.Join(r.dir, "logs", "pgbouncer.log"))
	}
	if r.cluster != nil {
		if data, err := os.ReadFile(r.cluster.LogPath()); err == nil {
			_ = os.WriteFile(filepath.Join(r.dir, "logs", "postgres.log"), data, 0o644)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := r.cluster.Stop(ctx); err != nil {
			r.logf("chaos: stopping cluster: %v", err)
		}
	}
}

// addFault records a fault in memory and in faults.jsonl.
func (r *runner) addFault(f Fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
	if b, err := json.Marshal(f); err == nil {
		_, _ = r.flog.Write(append(b, '\n'))
	}
}

// procConfig is the config of a process for slot name (e.g. "w2").
func (r *runner) procConfig(role, slot string, idx int) ProcConfig {
	cfg := ProcConfig{
		Role: role, DSN: r.dsn, Queue: queueName, Consumer: consumerName, Slots: r.o.Slots,
		Policy: r.o.Policy, LeaseTTL: r.o.LeaseTTL, RetryDelay: r.o.RetryDelay, BatchSize: r.o.BatchSize, Lanes: r.o.Lanes,
		ErrorRate: r.o.ErrorRate, PanicRate: r.o.PanicRate, SlowRate: r.o.SlowRate, SleepMax: r.o.SleepMax,
		Rate: r.o.Rate / float64(r.o.Producers), PoisonPct: r.o.PoisonPct, Tx: r.o.Tx,
	}
	switch role {
	case RoleWorker:
		// Odd workers go through PgBouncer (no LISTEN there: poll only).
		if r.bouncer != nil && idx%2 == 1 {
			cfg.DSN = r.bouncer.DSN(dbName, pgcluster.Superuser)
			cfg.PollOnly = true
		}
		// Workers 0, 1, 4, 5, … gather their woken slots' receives into
		// one call; the others receive slot by slot: both paths run under
		// every fault, with and without PgBouncer.
		cfg.Gather = (idx/2)%2 == 0
	case RoleProducer:
		for k := idx; k < r.o.Keys; k += r.o.Producers {
			cfg.Keys = append(cfg.Keys, fmt.Sprintf("tenant-%03d", k))
		}
	}
	return cfg
}

// spawn starts a new incarnation of the process in slot (role, idx).
func (r *runner) spawn(role string, idx int) error {
	slot := fmt.Sprintf("%s%d", role[:1], idx)
	r.mu.Lock()
	r.incarn[slot]++
	id := fmt.Sprintf("%s.%d", slot, r.incarn[slot])
	r.mu.Unlock()
	cfg := r.procConfig(role, slot, idx)
	cfg.ID = id
	cfg.Record = filepath.Join(r.dir, "records", id+".jsonl")
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	command := r.o.ProcCommand
	if role == RoleWorker && r.o.isTSWorker(idx) {
		command = r.tsCommand
	} else if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		command = []string{exe, "chaos"}
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(os.Environ(), EnvRole+"="+role, EnvConfig+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.OpenFile(filepath.Join(r.dir, "logs", id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", id, err)
	}
	p := &proc{id: id, role: role, slot: slot, cmd: cmd, done: make(chan struct{})}
	r.mu.Lock()
	r.procs[slot] = p
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		close(p.done)
		r.mu.Lock()
		expected := p.expectExit
		r.mu.Unlock()
		if !expected {
			// A crash nobody asked for: record it (it ends the process's
			// handler intervals) and let the runner notice in the summary.
			r.addFault(Fault{Kind: FaultProcessExit, Target: id, Start: time.Now(), End: time.Now()})
			r.logf("chaos: %s exited by itself: %v (restarting it)", id, err)
			time.Sleep(500 * time.Millisecond)
			r.mu.Lock()
			ending := r.ending
			r.mu.Unlock()
			if !ending {
				if err := r.spawn(role, idx); err != nil {
					r.logf("chaos: restarting %s: %v", slot, err)
				}
			}
		}
	}()
	return nil
}

// current returns the live incarnation in slot.
func (r *runner) current(slot string) *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[slot]
}

// kill SIGKILLs the process in slot and starts a new incarnation.
func (r *runner) kill(kind, role string, idx int) error {
	slot := fmt.Sprintf("%s%d", role[:1], idx)
	p := r.current(slot)
	r.mu.Lock()
	p.expectExit = true
	r.mu.Unlock()
	at := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	r.addFault(Fault{Kind: kind, Target: p.id, Start: at, End: time.Now()})
	time.Sleep(100 * time.Millisecond)
	return r.spawn(role, idx)
}

// stopGracefully sends SIGTERM and waits (then SIGKILL).
func (r *runner) stopGracefully(p *proc, wait time.Duration) {
	r.mu.Lock()
	p.expectExit = true
	r.mu.Unlock()
	at := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	r.addFault(Fault{Kind: FaultShutdown, Target: p.id, Start: at, End: time.Now()})
}

func (r *runner) run(ctx context.Context) (*Summary, error) {
	o := r.o
	start := time.Now()
	if err := r.spawn(RoleTicker, 0); err != nil {
		return nil, err
	}
	for i := range o.allWorkers() {
		if err := r.spawn(RoleWorker, i); err != nil {
			return nil, err
		}
	}
	for i := range o.Producers {
		if err := r.spawn(RoleProducer, i); err != nil {
			return nil, err
		}
	}
	r.logf("chaos: %d producers, %d Go and %d TypeScript workers, %d slots, %d keys, policy %s, lease TTL %v, faults %v, pgbouncer %v",
		o.Producers, o.Workers, o.TSWorkers, o.Slots, o.Keys, o.Policy, o.LeaseTTL, o.Faults, r.bouncer != nil)

	// Fault phase.
	faultCtx, cancel := context.WithTimeout(ctx, o.Duration)
	err := r.schedule(faultCtx)
	cancel()
	if err != nil && ctx.Err() == nil {
		return nil, err
	}
	// Heal: everything up, then producers stop.
	r.logf("chaos: fault phase over, stopping producers")
	for i := range o.Producers {
		r.stopGracefully(r.current(fmt.Sprintf("p%d", i)), 10*time.Second)
	}
	drained, err := r.drain(ctx)
	if err != nil {
		return nil, err
	}
	for i := range o.allWorkers() {
		r.stopGracefully(r.current(fmt.Sprintf("w%d", i)), 15*time.Second)
	}
	r.stopGracefully(r.current("t0"), 10*time.Second)
	r.mu.Lock()
	r.ending = true
	r.mu.Unlock()
	end := time.Now()

	h, slotEpochs, err := r.history(context.WithoutCancel(ctx), end)
	if err != nil {
		return nil, err
	}
	if err := saveTruth(r.dir, h); err != nil {
		r.logf("chaos: saving truth.json: %v", err)
	}
	rep := Check(h)
	sum := &Summary{Policy: o.Policy, Duration: end.Sub(start), Drained: drained, Faults: map[string]int{},
		SlotEpochs: slotEpochs, Report: rep, Tx: o.Tx, Workers: o.Workers, TSWorkers: o.TSWorkers}
	for _, a := range h.Attempts {
		if a.Outcome == OutcomeOK && o.tsProc(a.Proc) {
			sum.TSSuccesses++
		}
	}
	for _, f := range h.Faults {
		if f.Kind == FaultWorkerKill && o.tsProc(f.Target) {
			sum.TSKills++
		}
		switch f.Kind {
		case FaultShutdown, FaultFence, FaultWorkError:
		default:
			sum.Faults[f.Kind]++
		}
	}
	sum.Faults[FaultHandlerError] = rep.Errors
	sum.Faults[FaultHandlerPanic] = rep.Panics
	sum.Fencings = countInLogs(filepath.Join(r.dir, "logs"), "pgque: slot fenced")
	sum.Faults[FaultLeaseExpiry] = sum.Fencings
	sum.Claims = len(h.Claims)
	for _, c := range h.Claims {
		if o.tsProc(c.Proc) {
			sum.TSClaims++
		}
	}
	return sum, nil
}

// schedule injects faults until ctx ends.
func (r *runner) schedule(ctx context.Context) error {
	o := r.o
	if len(o.Faults) == 0 {
		<-ctx.Done()
		return nil
	}
	order := slices.Clone(o.Faults)
	r.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for n := 0; ; n++ {
		wait := time.Duration(float64(o.FaultInterval) * (0.5 + r.rng.Float64()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		kind := order[n%len(order)]
		if n >= len(order) {
			kind = o.Faults[r.rng.IntN(len(o.Faults))]
		}
		if err := r.inject(ctx, kind); err != nil {
			return fmt.Errorf("injecting %s: %w", kind, err)
		}
	}
}

func (r *runner) inject(ctx context.Context, kind string) error {
	o := r.o
	switch kind {
	case FaultWorkerKill:
		i := r.pickWorker(kind)
		r.logf("chaos: SIGKILL %s", r.current(fmt.Sprintf("w%d", i)).id)
		return r.kill(kind, RoleWorker, i)
	case FaultProducerKill:
		i := r.rng.IntN(o.Producers)
		r.logf("chaos: SIGKILL %s", r.current(fmt.Sprintf("p%d", i)).id)
		return r.kill(kind, RoleProducer, i)
	case FaultTickerKill:
		r.logf("chaos: SIGKILL %s", r.current("t0").id)
		return r.kill(kind, RoleTicker, 0)
	case FaultWorkerStop:
		p := r.current(fmt.Sprintf("w%d", r.pickWorker(kind)))
		d := o.LeaseTTL*2 + time.Duration(r.rng.Int64N(int64(o.LeaseTTL)))
		r.logf("chaos: SIGSTOP %s for %v", p.id, d)
		at := time.Now()
		_ = p.cmd.Process.Signal(syscall.SIGSTOP)
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		r.addFault(Fault{Kind: kind, Target: p.id, Start: at, End: time.Now()})
	case FaultPGRestart:
		r.logf("chaos: Postgres immediate restart")
		at := time.Now()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err := r.cluster.Restart(rctx, pgcluster.ModeImmediate)
		r.addFault(Fault{Kind: kind, Start: at, End: time.Now()})
		return err
	case FaultResize:
		return r.resize(ctx)
	case FaultPgBouncerKill:
		r.logf("chaos: SIGKILL pgbouncer")
		at := time.Now()
		r.bouncer.Kill()
		time.Sleep(300 * time.Millisecond)
		err := r.bouncer.Start(context.WithoutCancel(ctx))
		r.addFault(Fault{Kind: kind, Start: at, End: time.Now()})
		return err
	default:
		return fmt.Errorf("unknown fault kind %q", kind)
	}
	return nil
}

// drain waits until every committed event succeeded or was dead-lettered,
// at most DrainTimeout.
func (r *runner) drain(ctx context.Context) (bool, error) {
	deadline := time.Now().Add(r.o.DrainTimeout)
	loader := newAttemptLoader(filepath.Join(r.dir, "records"))
	conn, err := connectRetry(ctx, r.dsn)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		if err := loader.load(); err != nil {
			return false, err
		}
		done := map[int64]bool{}
		for _, a := range loader.attempts {
			if a.Outcome == OutcomeOK {
				done[a.EvID] = true
			}
		}
		var pending int64
		err := conn.QueryRow(ctx, `select count(*) from chaos_sent s
			where s.ev_id <> all($1) and not exists (select 1 from pgque.dead_letter d where d.ev_id = s.ev_id)`,
			slices.Collect(mapKeys(done))).Scan(&pending)
		if err != nil {
			return false, err
		}
		if pending == 0 {
			r.logf("chaos: drained")
			return true, nil
		}
		if time.Now().After(deadline) {
			r.logf("chaos: %d events still pending after the drain timeout %v", pending, r.o.DrainTimeout)
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func connectRetry(ctx context.Context, dsn string) (*pgx.Conn, error) {
	var last error
	for range 100 {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			return conn, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil, last
}

// history assembles the History from the records, the fault log and the
// database's truth (chaos_sent, dead letters, slot epochs).
func (r *runner) history(ctx context.Context, end time.Time) (*History, int64, error) {
	loader := newAttemptLoader(filepath.Join(r.dir, "records"))
	if err := loader.load(); err != nil {
		return nil, 0, err
	}
	h := &History{Policy: r.o.Policy, LeaseTTL: r.o.LeaseTTL, End: end, Attempts: loader.attempts}
	r.mu.Lock()
	h.Faults = slices.Clone(r.faults)
	r.mu.Unlock()
	logged, claims := readLogs(filepath.Join(r.dir, "logs"))
	h.Faults, h.Claims = append(h.Faults, logged...), claims
	conn, err := connectRetry(ctx, r.dsn)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(ctx)
	rows, _ := conn.Query(ctx, `select key, seq, ev_id from chaos_sent order by ev_id`)
	h.Committed, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Committed])
	if err != nil {
		return nil, 0, fmt.Errorf("reading chaos_sent: %w", err)
	}
	rows, _ = conn.Query(ctx, `select ev_id, coalesce(ev_extra1, ''), dl_consumer, dl_time from pgque.dead_letter order by dl_id`)
	h.DeadLetters, err = pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
	if err != nil {
		return nil, 0, fmt.Errorf("reading dead letters: %w", err)
	}
	h.KeySlotsByN = map[int]map[string]int{}
	for _, n := range resizeNs(r.o.Slots) {
		rows, _ = conn.Query(ctx, `select distinct key, pgque.slot_of(key, $1) from chaos_sent`, n)
		m := map[string]int{}
		var key string
		var slot int
		if _, err := pgx.ForEachRow(rows, []any{&key, &slot}, func() error { m[key] = slot; return nil }); err != nil {
			return nil, 0, fmt.Errorf("reading key slots: %w", err)
		}
		h.KeySlotsByN[n] = m
	}
	h.KeySlots = h.KeySlotsByN[r.o.Slots]
	if r.o.Tx {
		h.Tx, h.Effects = true, map[int64]int{}
		rows, _ = conn.Query(ctx, `select ev_id, count(*)::int from chaos_effects group by ev_id`)
		var ev int64
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&ev, &n}, func() error { h.Effects[ev] = n; return nil }); err != nil {
			return nil, 0, fmt.Errorf("reading chaos_effects: %w", err)
		}
	}
	var epochs int64
	if err := conn.QueryRow(ctx, `select coalesce(sum(sl_epoch), 0)::bigint from pgque.slot_lease`).Scan(&epochs); err != nil {
		return nil, 0, fmt.Errorf("reading slot epochs: %w", err)
	}
	return h, epochs, nil
}

// PrintSummary writes the summary table.
func PrintSummary(w io.Writer, s *Summary) {
	rep := s.Report
	fmt.Fprintf(w, "\n== pgque chaos summary (policy %s, %v, drained %v)\n", s.Policy, s.Duration.Round(time.Second), s.Drained)
	row := func(k string, v any) { fmt.Fprintf(w, "  %-34s %v\n", k, v) }
	if s.Workers > 0 || s.TSWorkers > 0 {
		row("workers (Go, TypeScript)", fmt.Sprintf("%d, %d", s.Workers, s.TSWorkers))
	}
	row("events committed", rep.Committed)
	if s.Tx {
		row("effects (duplicates, missing)", fmt.Sprintf("%d (%d, %d)", rep.Effects, rep.EffectDuplicates, rep.EffectsMissing))
	}
	row("keys", rep.Keys)
	row("dead-lettered", rep.DeadLettered)
	row("handler runs", rep.Attempts)
	row("  ok", rep.Successes)
	if s.TSWorkers > 0 {
		row("  ok by TypeScript workers", s.TSSuccesses)
	}
	row("  skipped behind a failed head", rep.Skipped)
	row("  retries (retry_count > 0)", rep.Retries)
	row("  redeliveries (unacked chunk)", rep.Redeliveries)
	row("  duplicate successes (explained)", fmt.Sprintf("%d (%d)", rep.DuplicateSuccesses, rep.ExplainedDuplicates))
	row("takeovers (epoch changes seen)", rep.Takeovers)
	row("slot epochs (sum, from the DB)", s.SlotEpochs)
	row("fencings (worker logs)", s.Fencings)
	row("lease claims (worker logs)", s.Claims)
	if s.TSWorkers > 0 {
		row("  by TypeScript workers", s.TSClaims)
	}
	row("takeovers from live holders", rep.LiveTakeovers)
	row("zombie handler runs", rep.ZombieRuns)
	row("handlers cancelled (lease lost)", rep.Cancelled)
	row("zombie overlaps (max active)", fmt.Sprintf("%d (%v)", rep.ZombieOverlaps, rep.MaxZombieOverlap.Round(time.Millisecond)))
	fmt.Fprintf(w, "  faults:\n")
	kinds := append(slices.Clone(AllFaults), FaultHandlerError, FaultHandlerPanic, FaultLeaseExpiry, FaultProcessExit)
	for _, k := range kinds {
		row("    "+k, s.Faults[k])
		if k == FaultWorkerKill && s.TSWorkers > 0 {
			row("      of TypeScript workers", s.TSKills)
		}
	}
	fmt.Fprintf(w, "  violations:\n")
	for _, g := range []string{GNoLoss, GG1, GG2, GG3, GPhantom} {
		row("    "+g, rep.ByGuarantee[g])
	}
	for _, c := range slices.Sorted(mapKeys(rep.ByCheck)) {
		row("    "+c, rep.ByCheck[c])
	}
	for _, v := range rep.Violations {
		fmt.Fprintf(w, "  ! %s\n", v)
	}
	if s.OK() {
		fmt.Fprintf(w, "  result: PASS\n")
	} else {
		fmt.Fprintf(w, "  result: FAIL (%d violations; records in %s)\n", rep.ViolationCount(), s.RunDir)
	}
}

// countInLogs counts the lines containing needle in the files of dir.
func countInLogs(dir, needle string) int {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil {
			n += bytes.Count(b, []byte(needle))
		}
	}
	return n
}

// truthFile keeps, beside the records, what the checker took from the
// database and the runner (committed events, dead letters, key slots,
// faults), so a run can be checked again offline with -recheck.
const truthFile = "truth.json"

func saveTruth(dir string, h *History) error {
	t := *h
	t.Attempts = nil
	b, err := json.Marshal(&t)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, truthFile), b, 0o644)
}

// Recheck loads a finished run's directory and checks it again.
func Recheck(dir string) (*History, *Report, error) {
	var h History
	loader := newAttemptLoader(filepath.Join(dir, "records"))
	if err := loader.load(); err != nil {
		return nil, nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, truthFile))
	if errors.Is(err, os.ErrNotExist) {
		// A run that did not get to save its truth: records and faults
		// only, enough for timelines, not for a verdict.
		h.Attempts = loader.attempts
		fb, err := os.ReadFile(filepath.Join(dir, "faults.jsonl"))
		if err != nil {
			return nil, nil, err
		}
		for _, l := range bytes.Split(fb, []byte("\n")) {
			var f Fault
			if json.Unmarshal(l, &f) == nil {
				h.Faults = append(h.Faults, f)
			}
		}
		logged, claims := readLogs(filepath.Join(dir, "logs"))
		h.Faults, h.Claims = append(h.Faults, logged...), claims
		return &h, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, nil, err
	}
	if !slices.ContainsFunc(h.Faults, func(f Fault) bool { return f.Kind == FaultFence || f.Kind == FaultWorkError }) {
		logged, _ := readLogs(filepath.Join(dir, "logs")) // a run from before they were saved
		h.Faults = append(h.Faults, logged...)
	}
	if h.Claims == nil {
		_, h.Claims = readLogs(filepath.Join(dir, "logs"))
	}
	h.Attempts = loader.attempts
	return &h, Check(&h), nil
}

// PrintKey writes the timeline of one key: its committed events, every
// handler run, dead letters and the faults, in time order.
func PrintKey(w io.Writer, h *History, key string) {
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	for _, a := range h.Attempts {
		if a.Key == key {
			lines = append(lines, line{a.Start, fmt.Sprintf("start ev %d seq %d retry %d by %s slot %d epoch %d -> %s (end %s)",
				a.EvID, a.Seq, a.Retry, a.Proc, a.Slot, a.Epoch, a.Outcome, a.End.Format("15:04:05.000000"))})
		}
	}
	for _, d := range h.DeadLetters {
		if d.Key == key {
			lines = append(lines, line{d.Time, fmt.Sprintf("dead letter ev %d (%s)", d.EvID, d.Consumer)})
		}
	}
	for _, f := range h.Faults {
		lines = append(lines, line{f.Start, fmt.Sprintf("fault %s %s (until %s)", f.Kind, f.Target, f.End.Format("15:04:05.000000"))})
	}
	slices.SortStableFunc(lines, func(a, b line) int { return a.at.Compare(b.at) })
	var evs []string
	for _, c := range h.Committed {
		if c.Key == key {
			evs = append(evs, fmt.Sprintf("%d(seq %d)", c.EvID, c.Seq))
		}
	}
	fmt.Fprintf(w, "key %q (slot %d): committed %s\n", key, h.KeySlots[key], strings.Join(evs, " "))
	for _, l := range lines {
		fmt.Fprintf(w, "  %s %s\n", l.at.Format("15:04:05.000000"), l.text)
	}
}

var (
	logTime   = regexp.MustCompile(`^time=(\S+) `)
	logWorker = regexp.MustCompile(` worker=(\S+)`)
	logSlot   = regexp.MustCompile(` slot=([0-9]+)`)
	logNSlots = regexp.MustCompile(` nslots=([0-9]+)`)
	logEpoch  = regexp.MustCompile(` epoch=([0-9]+)`)
)

// readLogs reads the workers' logs for the slots they fenced themselves
// and the slot calls that failed (the explanations of same-epoch
// redeliveries), and for the leases they were granted (when an older
// epoch was superseded).
func readLogs(dir string) ([]Fault, []Claim) {
	files, _ := filepath.Glob(filepath.Join(dir, "w*.log"))
	var faults []Fault
	var claims []Claim
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			var kind string
			switch {
			case strings.Contains(line, `msg="pgque: slot fenced"`):
				kind = FaultFence
			case strings.Contains(line, `msg="pgque: working slot"`):
				kind = FaultWorkError
			case strings.Contains(line, `msg="pgque: slot claimed"`):
			default:
				continue
			}
			tm, wk := logTime.FindStringSubmatch(line), logWorker.FindStringSubmatch(line)
			if tm == nil || wk == nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, tm[1])
			if err != nil {
				continue
			}
			slot := -1
			if sl := logSlot.FindStringSubmatch(line); sl != nil {
				slot, _ = strconv.Atoi(sl[1])
			}
			if kind == "" {
				n, e := logNSlots.FindStringSubmatch(line), logEpoch.FindStringSubmatch(line)
				if slot < 0 || n == nil || e == nil {
					continue
				}
				cl := Claim{Proc: wk[1], Slot: slot, At: at}
				cl.NSlots, _ = strconv.Atoi(n[1])
				cl.Epoch, _ = strconv.ParseInt(e[1], 10, 64)
				claims = append(claims, cl)
				continue
			}
			flt := Fault{Kind: kind, Target: wk[1], Start: at, End: at}
			if slot >= 0 {
				flt.Slot = &slot
			}
			faults = append(faults, flt)
		}
	}
	return faults, claims
}

// resizeNs are the N a resize fault chooses from: at most four, the limit
// of distinct N per queue, the first being the run's own.
func resizeNs(n int) []int {
	out := []int{n}
	for _, m := range []int{n * 2, max(1, n/2), n + 3} {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// resize starts a resize of the consumer to another N of resizeNs. The
// resize runs on its own (the workers' receives and maint() complete it);
// one still in progress is left alone. The call is not cut short when the
// run's time is up (a loaded machine ran resize_slots past it, and the
// run failed on a fault it was still injecting): it waits, as a restart
// does, up to a minute, for the queue's and the group's row locks, which
// a tick or a cutover hold meanwhile.
func (r *runner) resize(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, r.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var cur int
	var to *int
	if err := conn.QueryRow(ctx, `select nslots, resize_to from pgque.slot_group_info($1, $2)`, queueName, consumerName).Scan(&cur, &to); err != nil {
		return fmt.Errorf("reading the slot count: %w", err)
	}
	if to != nil {
		r.logf("chaos: resize %d -> %d still in progress", cur, *to)
		return nil
	}
	var choices []int
	for _, n := range resizeNs(r.o.Slots) {
		if n != cur {
			choices = append(choices, n)
		}
	}
	n := choices[r.rng.IntN(len(choices))]
	at := time.Now()
	if _, err := conn.Exec(ctx, `select pgque.resize_slots($1, $2, $3)`, queueName, consumerName, n); err != nil {
		return fmt.Errorf("resizing %d -> %d: %w", cur, n, err)
	}
	r.logf("chaos: resize %d -> %d slots (the call took %v)", cur, n, time.Since(at).Round(time.Millisecond))
	r.addFault(Fault{Kind: FaultResize, Target: strconv.Itoa(n), Start: at, End: time.Now()})
	return nil
}
