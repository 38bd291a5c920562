package pgque

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/notifier"
	"github.com/pgque/pgque/internal/workerpool"
)

// Client is the entry point: it sends events and creates consumers and
// tickers over one pgxpool.Pool. A Client is safe for concurrent use.
type Client struct {
	pool     *pgxpool.Pool
	ownsPool bool
	config   Config
	logger   *slog.Logger
	metrics  *metrics.Metrics
	queries  *dbq.Queries
	// notifier is nil when Config.PollOnly is set.
	notifier *notifier.Notifier
}

// NewClient returns a Client over pool. The caller keeps ownership of pool:
// Close does not close it.
func NewClient(pool *pgxpool.Pool, config *Config) (*Client, error) {
	if pool == nil {
		return nil, invalidConfig("pool is nil")
	}
	if err := config.validate(); err != nil {
		return nil, err
	}
	cfg := config.withDefaults()
	c := &Client{
		pool:    pool,
		config:  cfg,
		logger:  cfg.Logger,
		metrics: metrics.New(cfg.Registerer),
		queries: dbq.New(pool),
	}
	if !cfg.PollOnly {
		// The LISTEN session is taken from the pool and hijacked, so that
		// it is opened exactly as the application's own connections are:
		// with the pool's BeforeConnect and AfterConnect hooks (IAM
		// tokens, rotated passwords, session settings). It then belongs to
		// the notifier, which closes it.
		c.notifier = notifier.New(func(ctx context.Context) (*pgx.Conn, error) {
			pc, err := pool.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return pc.Hijack(), nil
		}, []string{workerpool.TickChannel, workerpool.PresenceChannel}, cfg.Logger)
	}
	return c, nil
}

// Connect opens a pool from dsn (a libpq connection string or URL) and
// returns a Client that owns it: Close closes the pool.
func Connect(ctx context.Context, dsn string, config *Config) (*Client, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("opening pool: %w", err)
	}
	c, err := NewClient(pool, config)
	if err != nil {
		pool.Close()
		return nil, err
	}
	c.ownsPool = true
	return c, nil
}

// Pool returns the pool the client works over, for the caller's own
// transactions (see SendTx).
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// Close closes the pool if Connect opened it. Stop consumers and tickers
// first.
func (c *Client) Close() {
	if c.ownsPool {
		c.pool.Close()
	}
}

// MetricsHandler serves the client's metrics in the Prometheus exposition
// format. It serves Config.Registerer when that is also a Gatherer (a
// *prometheus.Registry is both), and prometheus.DefaultGatherer otherwise.
func (c *Client) MetricsHandler() http.Handler {
	if g, ok := c.config.Registerer.(prometheus.Gatherer); ok {
		return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	}
	return promhttp.HandlerFor(prometheus.DefaultGatherer, promhttp.HandlerOpts{})
}
