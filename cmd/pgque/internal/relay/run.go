package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/httpbound"
)

// ShutdownTimeoutDefault bounds a graceful stop: requests in flight finish
// and their chunks are acknowledged within it, or are abandoned (the next
// owner receives them again).
const ShutdownTimeoutDefault = 30 * time.Second

// RunConfig is one relay process: the consumer it runs, where it posts,
// and what else it serves.
type RunConfig struct {
	// Client is the pgque client the consumer and the ticker use.
	Client *pgque.Client
	// Consumer configures the partitioned consumer; Handler must be nil
	// (the relay is the handler). Its MaxWorkers, the requests this process
	// runs at once across the keys of all its slots (one per key at a time),
	// defaults to the relay's MaxInFlight: more would only wait for a
	// request place while counting as a running handler.
	Consumer pgque.PartitionedConsumerConfig
	// Relay configures the delivery; its Queue and Consumer default to the
	// consumer's.
	Relay Config
	// Ticker, when set, also runs a ticker in this process.
	Ticker *pgque.TickerConfig
	// Listen, when set, serves /metrics (MetricsHandler), /healthz and
	// /readyz on this address.
	Listen         string
	MetricsHandler http.Handler
	// ShutdownTimeout bounds the graceful stop. Default
	// ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration
	// Logger receives the process's logs. Default slog.Default().
	Logger *slog.Logger
}

// Run runs the relay until ctx ends, then stops gracefully: it stops
// claiming and receiving, lets the requests in flight finish, acknowledges
// their chunks and releases the slot leases.
func Run(ctx context.Context, rc *RunConfig) error {
	log := rc.Logger
	if log == nil {
		log = slog.Default()
	}
	if rc.Consumer.Handler != nil {
		return invalid("RunConfig.Consumer.Handler must be nil: the relay is the handler")
	}
	rcfg := rc.Relay
	rcfg.Logger = log
	if rcfg.Queue == "" && rcfg.Consumer == "" {
		rcfg.Queue, rcfg.Consumer = rc.Consumer.Queue, rc.Consumer.Consumer
	}
	r, err := New(&rcfg)
	if err != nil {
		return err
	}
	defer r.Close()
	ccfg := rc.Consumer
	ccfg.Handler = r.Handle
	if ccfg.MaxWorkers == 0 {
		ccfg.MaxWorkers = r.cfg.MaxInFlight
	}
	pc, err := rc.Client.NewPartitionedConsumer(&ccfg)
	if err != nil {
		return err
	}
	var state atomic.Int32 // 0 starting, 1 running, 2 stopping
	if rc.Listen != "" {
		stop, err := serve(rc.Listen, rc.MetricsHandler, pc, &state, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	// The consumer and the ticker get contexts of their own: cancelling
	// them abandons the work like a crash. A signal stops them through
	// Stop instead.
	runCtx := context.WithoutCancel(ctx)
	var ticker *pgque.Ticker
	if rc.Ticker != nil {
		ticker, err = rc.Client.NewTicker(rc.Ticker)
		if err != nil {
			return err
		}
		if err := ticker.Start(runCtx); err != nil {
			return err
		}
	}
	if err := pc.Start(runCtx); err != nil {
		if ticker != nil {
			_ = stopWithin(ticker.Stop, rc.ShutdownTimeout)
		}
		return err
	}
	state.Store(1)
	log.Info("pgque relay: started", slog.String("queue", ccfg.Queue), slog.String("consumer", ccfg.Consumer),
		slog.Int("slots", ccfg.Slots), slog.Int("concurrency", ccfg.MaxWorkers), slog.String("worker", pc.WorkerID()), slog.String("to", redacted(rcfg.URL)),
		slog.Bool("ticker", ticker != nil), slog.String("policy", pc.Policy().String()))
	<-ctx.Done()
	state.Store(2)
	log.Info("pgque relay: stopping: finishing requests in flight", slog.String("worker", pc.WorkerID()))
	r.BeginStop()
	var errs []error
	if err := stopWithin(pc.Stop, rc.ShutdownTimeout); err != nil {
		errs = append(errs, fmt.Errorf("stopping the consumer: %w", err))
	}
	if ticker != nil {
		if err := stopWithin(ticker.Stop, rc.ShutdownTimeout); err != nil {
			errs = append(errs, fmt.Errorf("stopping the ticker: %w", err))
		}
	}
	log.Info("pgque relay: stopped", slog.String("worker", pc.WorkerID()))
	return errors.Join(errs...)
}

func stopWithin(stop func(context.Context) error, d time.Duration) error {
	if d <= 0 {
		d = ShutdownTimeoutDefault
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return stop(ctx)
}

// serve runs the metrics and health server until stop is called.
//
// /healthz answers 200 while the process runs (a supervisor restarts it
// otherwise). /readyz answers 200 once the consumer runs — it owns slots
// or is trying to claim some — and 503 before that and while stopping; its
// body lists the owned slots.
func serve(addr string, metrics http.Handler, pc *pgque.PartitionedConsumer, state *atomic.Int32, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics and health on %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	if metrics != nil {
		mux.Handle("/metrics", metrics)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := state.Load()
		body := struct {
			State      string `json:"state"`
			OwnedSlots []int  `json:"owned_slots"`
			WorkerID   string `json:"worker_id"`
		}{State: [...]string{"starting", "running", "stopping"}[st], OwnedSlots: pc.OwnedSlots(), WorkerID: pc.WorkerID()}
		if body.OwnedSlots == nil {
			body.OwnedSlots = []int{}
		}
		w.Header().Set("Content-Type", "application/json")
		if st != 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	srv := httpbound.Server(httpbound.LoopbackOnly(ln, mux))
	ln = httpbound.Listener(ln, httpbound.MaxConns)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pgque relay: metrics server", slog.Any("error", err))
		}
	}()
	log.Info("pgque relay: serving /metrics, /healthz, /readyz", slog.String("addr", ln.Addr().String()))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// redacted is the URL without any password, for logs.
func redacted(s string) string {
	if u, err := parseURL(s); err == nil {
		return u.Redacted()
	}
	return "(unparsable URL)"
}
