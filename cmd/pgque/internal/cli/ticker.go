package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/pgqueprom"
)

// tickerStopTimeout bounds a clean ticker shutdown (resigning the lease).
const tickerStopTimeout = 10 * time.Second

func (a *app) tickerCommand() *cobra.Command {
	var (
		cfg         pgque.TickerConfig
		statsEvery  time.Duration
		metricsAddr string
		verbose     bool
	)
	cmd := &cobra.Command{
		Use:   "ticker",
		Short: "Run the ticker daemon (leader-elected: run as many as you like)",
		Long: `Ticker runs the ticker daemon: while it holds the single ticker lease it makes
ticks for every queue (consumers see nothing until a tick covers their
events), re-inserts due retries and runs maintenance (table rotation, tick
clean-up). Any number may run; one leads, the others stand by and take over
within the lease TTL if the leader dies (at once when it stops cleanly).

It logs what it does with log/slog on stderr and stops cleanly on SIGINT or
SIGTERM, resigning the lease.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			log := a.logger(level)
			reg := prometheus.NewRegistry()
			obs, err := pgqueprom.New(reg)
			if err != nil {
				return err
			}
			s, err := a.connectWith(cmd.Context(), &pgque.Config{Logger: log, PollOnly: true, Observer: obs})
			if err != nil {
				return err
			}
			defer s.Close()
			if cfg.WorkerID == "" {
				cfg.WorkerID = defaultWorkerID()
			}
			return a.runTicker(cmd.Context(), s, &cfg, log, statsEvery, metricsAddr, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.WorkerID, "worker", "", "id of this ticker in the lease (default hostname-pid-random)")
	f.DurationVar(&cfg.LeaseTTL, "lease-ttl", pgque.TickerLeaseTTLDefault, "ticker lease lifetime")
	f.DurationVar(&cfg.TickInterval, "tick-interval", pgque.TickIntervalDefault, "how often the leader calls ticker()")
	f.DurationVar(&cfg.RetryInterval, "retry-interval", pgque.RetryIntervalDefault, "how often due retries are re-inserted")
	f.DurationVar(&cfg.MaintInterval, "maint-interval", pgque.MaintIntervalDefault, "how often tables are rotated and ticks cleaned up")
	f.DurationVar(&statsEvery, "stats-interval", time.Minute, "how often the leader logs each queue's rate, backlog and ticker lag (0: never)")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address, e.g. :9187")
	f.BoolVarP(&verbose, "verbose", "v", false, "log at debug level")
	return cmd
}

// runTicker runs the ticker until ctx ends, then stops it cleanly.
func (a *app) runTicker(ctx context.Context, s *session, cfg *pgque.TickerConfig, log *slog.Logger, statsEvery time.Duration, metricsAddr string, metrics http.Handler) error {
	t, err := s.NewTicker(cfg)
	if err != nil {
		return usagef("%v", err)
	}
	if metricsAddr != "" {
		stop, err := serveMetrics(metricsAddr, metrics, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	// The ticker's own context is not ctx: cancelling it would abandon the
	// lease like a crash. A signal stops it through Stop instead.
	if err := t.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	log.Info("pgque: ticker started", slog.String("worker", cfg.WorkerID),
		slog.Duration("tick_interval", cfg.TickInterval), slog.Duration("lease_ttl", cfg.LeaseTTL))
	var stats <-chan time.Time
	if statsEvery > 0 {
		tk := time.NewTicker(statsEvery)
		defer tk.Stop()
		stats = tk.C
	}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-stats:
			if t.IsLeader() {
				logQueueStats(ctx, s, log)
			}
		}
	}
	log.Info("pgque: ticker stopping")
	stopCtx, cancel := context.WithTimeout(context.Background(), tickerStopTimeout)
	defer cancel()
	if err := t.Stop(stopCtx); err != nil {
		return fmt.Errorf("stopping the ticker: %w", err)
	}
	log.Info("pgque: ticker stopped")
	return nil
}

// logQueueStats logs one line per queue.
func logQueueStats(ctx context.Context, s *session, log *slog.Logger) {
	infos, err := s.queueInfos(ctx, "")
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("pgque: reading queue stats", slog.Any("error", err))
		}
		return
	}
	for _, q := range infos {
		rate := 0.0
		if q.EvPerSec != nil {
			rate = *q.EvPerSec
		}
		log.Info("pgque: queue", slog.String("queue", q.Name), slog.Float64("ev_per_sec", rate),
			slog.Int64("unticked", q.Unticked), slog.Float64("ticker_lag_seconds", q.TickerLagSeconds),
			slog.Int64("retry_pending", q.RetryPending), slog.Int64("dead_letters", q.DeadLetters))
	}
}

// serveMetrics serves h on addr until the returned stop is called.
func serveMetrics(addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serving metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pgque: metrics server", slog.Any("error", err))
		}
	}()
	log.Info("pgque: serving metrics", slog.String("addr", ln.Addr().String()), slog.String("path", "/metrics"))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
