package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
)

// Process roles.
const (
	RoleWorker   = "worker"
	RoleProducer = "producer"
	RoleTicker   = "ticker"
)

// Environment variables that turn a binary into a chaos process: the
// runner re-executes its own binary (or Options.ProcCommand) with these set.
const (
	// EnvRole names the role: worker, producer or ticker.
	EnvRole = "PGQUE_CHAOS_ROLE"
	// EnvConfig holds the process's ProcConfig as JSON.
	EnvConfig = "PGQUE_CHAOS_PROC"
)

// IsProc reports whether this process was started by the runner as a chaos
// process; a binary's main can then hand over to Main at once.
func IsProc() bool { return os.Getenv(EnvRole) != "" }

// ProcConfig is what one chaos process needs.
type ProcConfig struct {
	ID       string `json:"id"`
	Role     string `json:"role"`
	DSN      string `json:"dsn"`
	PollOnly bool   `json:"poll_only"`
	Record   string `json:"record"` // JSON-lines file for worker attempts
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	Slots    int    `json:"slots"`
	Policy   string `json:"policy"`

	LeaseTTL   time.Duration `json:"lease_ttl"`
	RetryDelay time.Duration `json:"retry_delay"`
	BatchSize  int           `json:"batch_size"`
	Lanes      int           `json:"lanes"`
	ErrorRate  float64       `json:"error_rate"`
	PanicRate  float64       `json:"panic_rate"`
	SlowRate   float64       `json:"slow_rate"`
	SleepMax   time.Duration `json:"sleep_max"`

	Keys      []string `json:"keys"`       // producer: the keys it owns
	Rate      float64  `json:"rate"`       // producer: events per second
	PoisonPct float64  `json:"poison_pct"` // producer: share of events that always fail

	// Tx: the worker's handler is a HandlerTx that writes one chaos_effects
	// row in its transaction before the usual handler body.
	Tx bool `json:"tx"`
	// Gather: the worker gathers the receives of the slots one tick
	// wakes into one call (GatherReceives, gatherReceives).
	Gather bool `json:"gather"`
}

// payload is the body of every chaos event.
type payload struct {
	Key    string `json:"key"`
	Seq    int64  `json:"seq"`
	Poison bool   `json:"poison,omitempty"`
}

// runProc runs one chaos process until SIGTERM/SIGINT.
func runProc(cfg ProcConfig, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Workers log at debug level: the checker reads their slot claims.
	level := slog.LevelWarn
	if cfg.Role == RoleWorker {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var err error
	switch cfg.Role {
	case RoleWorker:
		err = runWorker(ctx, cfg, logger)
	case RoleProducer:
		err = runProducer(ctx, cfg, logger)
	case RoleTicker:
		err = runTicker(ctx, cfg, logger)
	default:
		err = fmt.Errorf("unknown chaos role %q", cfg.Role)
	}
	if err != nil {
		fmt.Fprintf(stderr, "chaos %s %s: %v\n", cfg.Role, cfg.ID, err)
		return 1
	}
	return 0
}

// connect retries until the database answers (it may be restarting).
func connect(ctx context.Context, cfg ProcConfig, logger *slog.Logger) (*pgque.Client, error) {
	for {
		c, err := pgque.Connect(ctx, cfg.DSN, &pgque.Config{Logger: logger, PollOnly: cfg.PollOnly})
		if err == nil {
			if err = c.Pool().Ping(ctx); err == nil {
				return c, nil
			}
			c.Close()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func runTicker(ctx context.Context, cfg ProcConfig, logger *slog.Logger) error {
	c, err := connect(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	t, err := c.NewTicker(&pgque.TickerConfig{WorkerID: cfg.ID, LeaseTTL: time.Second,
		RetryInterval: 100 * time.Millisecond, MaintInterval: 2 * time.Second})
	if err != nil {
		return err
	}
	if err := t.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.Stop(sctx)
}

func runProducer(ctx context.Context, cfg ProcConfig, logger *slog.Logger) error {
	c, err := connect(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	// Continue each key's sequence after what earlier incarnations committed.
	seq := map[string]int64{}
	for {
		rows, err := c.Pool().Query(ctx, `select key, max(seq) from chaos_sent where key = any($1) group by key`, cfg.Keys)
		if err == nil {
			var k string
			var s int64
			_, err = pgx.ForEachRow(rows, []any{&k, &s}, func() error { seq[k] = s; return nil })
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	for ctx.Err() == nil {
		key := cfg.Keys[rng.IntN(len(cfg.Keys))]
		n := 1
		if rng.IntN(10) == 0 {
			n = 1 + rng.IntN(5) // sometimes a batch of the key's next events
		}
		events := make([]pgque.Event, n)
		seqs := make([]int64, n)
		for i := range events {
			seq[key]++ // a failed send leaves a gap, never a reuse
			seqs[i] = seq[key]
			events[i] = pgque.Event{Type: "chaos", PartitionKey: key,
				Payload: payload{Key: key, Seq: seqs[i], Poison: rng.Float64()*100 < cfg.PoisonPct}}
		}
		err := pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
			var ids []int64
			if n == 1 {
				id, err := c.SendTx(ctx, tx, cfg.Queue, events[0])
				if err != nil {
					return err
				}
				ids = []int64{id}
			} else {
				var err error
				if ids, err = c.SendBatchTx(ctx, tx, cfg.Queue, events); err != nil {
					return err
				}
			}
			// The committed set's truth: written in the send's transaction.
			for i, id := range ids {
				if _, err := tx.Exec(ctx, `insert into chaos_sent (key, seq, ev_id) values ($1, $2, $3)`, key, seqs[i], id); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			logger.Warn("chaos producer: send failed", slog.Any("error", err))
			time.Sleep(100 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(float64(interval) * float64(n) * (0.5 + rng.Float64()))):
		}
	}
	return nil
}

// pauseState is, per slot, the keys that failed in the chunk being handled:
// under pause their later events in the chunk are not run (the server
// defers them when the failure is nacked). The Go consumer does the same
// itself under FailurePolicyPause (it then never calls the handler for such
// an event); this is the handler's own guard, and records what it skipped.
type pauseState struct {
	mu    sync.Mutex
	slots map[int]*chunkFailures
}

type chunkFailures struct {
	chunk  uint64
	failed map[string]int64 // key -> ev_id of the failed head
}

// skip reports whether m must be skipped because an earlier event of its
// key failed in this chunk. A new chunk (a batch may come in several, and a
// redelivered chunk is a new one) forgets the failures.
func (p *pauseState) skip(m *pgque.Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.slots[m.Slot]
	if st == nil || st.chunk != m.Chunk {
		st = &chunkFailures{chunk: m.Chunk, failed: map[string]int64{}}
		p.slots[m.Slot] = st
	}
	head, ok := st.failed[m.PartitionKey]
	if !ok {
		return false
	}
	if m.ID > head {
		return true
	}
	delete(st.failed, m.PartitionKey)
	return false
}

func (p *pauseState) failed(m *pgque.Message) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.slots[m.Slot]; st != nil && st.chunk == m.Chunk {
		st.failed[m.PartitionKey] = m.ID
	}
}

// errInjected is the error a handler returns on purpose.
var errInjected = errors.New("chaos: injected handler error")

func runWorker(ctx context.Context, cfg ProcConfig, logger *slog.Logger) error {
	rec, err := openRecorder(cfg.Record, cfg.ID, true) // starts are fsynced before the body runs
	if err != nil {
		return err
	}
	defer rec.close()
	c, err := connect(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	ps := &pauseState{slots: map[int]*chunkFailures{}}
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	roll := func() (float64, time.Duration) {
		rngMu.Lock()
		defer rngMu.Unlock()
		sleep := time.Duration(rng.Int64N(int64(cfg.SleepMax) + 1))
		if rng.Float64() < cfg.SlowRate {
			sleep = cfg.LeaseTTL * 6 / 5 // outlives the TTL: the keeper must renew
		}
		return rng.Float64(), sleep
	}
	handler := func(hctx context.Context, m *pgque.Message) error {
		var p payload
		_ = json.Unmarshal(m.Payload, &p)
		a := Attempt{Proc: cfg.ID, Slot: m.Slot, NSlots: m.NSlots, Epoch: m.Epoch, Key: m.PartitionKey, EvID: m.ID, Seq: p.Seq,
			Retry: m.RetryCount, Start: time.Now()}
		if cfg.Policy == "pause" && ps.skip(m) {
			if err := rec.skipped(a); err != nil {
				panic(fmt.Sprintf("chaos: recording: %v", err)) // never run unrecorded
			}
			return nil
		}
		n, err := rec.start(a)
		if err != nil {
			// A handler that cannot record must not run: crash the process.
			fmt.Fprintf(os.Stderr, "chaos: recording start: %v\n", err)
			os.Exit(3)
		}
		dice, sleep := roll()
		select {
		case <-hctx.Done():
			_ = rec.end(n, OutcomeCancelled, time.Now())
			return context.Cause(hctx)
		case <-time.After(sleep):
		}
		switch {
		case p.Poison || dice < cfg.ErrorRate:
			ps.failed(m)
			_ = rec.end(n, OutcomeError, time.Now())
			return errInjected
		case dice < cfg.ErrorRate+cfg.PanicRate:
			ps.failed(m)
			_ = rec.end(n, OutcomePanic, time.Now())
			panic("chaos: injected handler panic")
		}
		if err := rec.end(n, OutcomeOK, time.Now()); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: recording end: %v\n", err)
			os.Exit(3)
		}
		return nil
	}
	retry := cfg.RetryDelay
	policy := pgque.FailurePolicySkip
	if cfg.Policy == "pause" {
		policy = pgque.FailurePolicyPause
	}
	pcfg := &pgque.PartitionedConsumerConfig{
		Queue:         cfg.Queue,
		Consumer:      cfg.Consumer,
		Slots:         cfg.Slots,
		WorkerID:      cfg.ID,
		FailurePolicy: policy,
		LeaseTTL:      cfg.LeaseTTL,
		ClaimInterval: 200 * time.Millisecond,
		PollInterval:  100 * time.Millisecond,
		BatchSize:     cfg.BatchSize,
		// Several key lanes per slot: slow handlers get their keys held
		// while the slot moves on, which the checker then sees per key.
		MaxWorkersPerSlot: cfg.Lanes,
		GatherReceives:    cfg.Gather,
		Handler:           handler,
		RetryDelay:        func(n int) time.Duration { return retry * time.Duration(n+1) },
	}
	if cfg.Tx {
		pcfg.Handler = nil
		pcfg.HandlerTx = func(hctx context.Context, tx pgx.Tx, m *pgque.Message) error {
			if _, err := tx.Exec(hctx, `insert into chaos_effects values ($1, $2, $3)`, m.ID, cfg.ID, m.Epoch); err != nil {
				return err
			}
			return handler(hctx, m)
		}
	}
	pc, err := c.NewPartitionedConsumer(pcfg)
	if err != nil {
		return err
	}
	for {
		err := pc.Start(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		logger.Warn("chaos worker: start failed, retrying", slog.Any("error", err))
		time.Sleep(200 * time.Millisecond)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pc.Stop(sctx)
}

// procFromEnv reads the process config the runner put in the environment.
func procFromEnv() (ProcConfig, error) {
	var cfg ProcConfig
	if err := json.Unmarshal([]byte(os.Getenv(EnvConfig)), &cfg); err != nil {
		return cfg, fmt.Errorf("%s: %w", EnvConfig, err)
	}
	if role := strings.TrimSpace(os.Getenv(EnvRole)); role != "" {
		cfg.Role = role
	}
	return cfg, nil
}
