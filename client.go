package pgque

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
	"github.com/pgque/pgque/internal/notifier"
	"github.com/pgque/pgque/internal/tickerd"
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
	// observed reports that Config.Observer was set, so measurements that
	// cost queries (the slot gauges) are worth making.
	observed bool
	// sends coalesces Send calls; nil when Config.SendConcurrency is
	// negative.
	sends *sendQueue
	// schemaChecked is set once CheckSchema succeeded.
	schemaChecked atomic.Bool
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
		pool:     pool,
		config:   cfg,
		logger:   cfg.Logger,
		metrics:  metrics.New(observerSink{cfg.Observer}),
		queries:  dbq.New(pool),
		observed: config != nil && config.Observer != nil,
	}
	c.sends = newSendQueue(c, cfg.SendConcurrency)
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
		}, []string{workerpool.TickChannel, workerpool.SlotsChannel, workerpool.PresenceChannel, tickerd.ResignChannel},
			func(ctx context.Context, channel, payload string) error {
				_, err := pool.Exec(ctx, "select pg_catalog.pg_notify($1, $2)", channel, payload)
				return err
			}, cfg.Logger)
	}
	return c, nil
}

// Connect opens a pool from dsn (a libpq connection string or URL) and
// returns a Client that owns it: Close closes the pool. It fails with
// ErrSchemaVersion or ErrNotInstalled when the database does not hold this
// library's SchemaVersion (see CheckSchema).
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
	if err := c.CheckSchema(ctx); err != nil {
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

// reportError hands a background error to Config.OnError, if set, as an
// *Error when it came from the database.
func (c *Client) reportError(ctx context.Context, err error) {
	if c.config.OnError == nil || err == nil {
		return
	}
	var mapped *Error
	if !errors.As(err, &mapped) {
		err = mapError("pgque background work", err)
	}
	c.config.OnError(ctx, err)
}
