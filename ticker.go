package pgque

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgque/pgque/internal/startstop"
	"github.com/pgque/pgque/internal/tickerd"
)

// Defaults for TickerConfig, tuned for low latency: new events are ticked
// within tens of milliseconds, while idle queues stay cheap because the SQL
// only writes a tick when one is due.
const (
	// TickIntervalDefault is how often the leading ticker calls ticker().
	TickIntervalDefault = 10 * time.Millisecond
	// RetryIntervalDefault is how often maint_retry_events() re-inserts due
	// retries.
	RetryIntervalDefault = time.Second
	// MaintIntervalDefault is how often maint() rotates tables and cleans up.
	MaintIntervalDefault = 30 * time.Second
	// TickerLeaseTTLDefault is the ticker lease lifetime: a crashed leader is
	// replaced about this long after the crash (at once after Stop).
	TickerLeaseTTLDefault = 10 * time.Second
)

// TickerConfig configures a Ticker.
type TickerConfig struct {
	// WorkerID identifies this ticker in the lease. Default
	// hostname-pid-random.
	WorkerID string
	// LeaseTTL is the ticker lease lifetime. Default TickerLeaseTTLDefault,
	// minimum LeaseTTLMin.
	LeaseTTL time.Duration
	// TickInterval is the leader's ticker() period. Default
	// TickIntervalDefault.
	TickInterval time.Duration
	// RetryInterval is the maint_retry_events() period. Default
	// RetryIntervalDefault.
	RetryInterval time.Duration
	// MaintInterval is the maint() period. Default MaintIntervalDefault.
	MaintInterval time.Duration
}

func (c *TickerConfig) withDefaults() TickerConfig {
	var out TickerConfig
	if c != nil {
		out = *c
	}
	if out.WorkerID == "" {
		out.WorkerID = defaultWorkerID()
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = TickerLeaseTTLDefault
	}
	if out.TickInterval == 0 {
		out.TickInterval = TickIntervalDefault
	}
	if out.RetryInterval == 0 {
		out.RetryInterval = RetryIntervalDefault
	}
	if out.MaintInterval == 0 {
		out.MaintInterval = MaintIntervalDefault
	}
	return out
}

func (c *TickerConfig) validate() error {
	switch {
	case c == nil:
		return nil
	case c.LeaseTTL != 0 && c.LeaseTTL < LeaseTTLMin:
		return invalidConfig("TickerConfig.LeaseTTL %v is below the minimum %v", c.LeaseTTL, LeaseTTLMin)
	case c.LeaseTTL > LeaseTTLMax:
		return invalidConfig("TickerConfig.LeaseTTL %v is above the maximum %v", c.LeaseTTL, LeaseTTLMax)
	case c.WorkerID != "" && checkText(c.WorkerID, WorkerIDMaxBytes) != "":
		return invalidConfig("TickerConfig.WorkerID %s", checkText(c.WorkerID, WorkerIDMaxBytes))
	case c.TickInterval < 0 || c.RetryInterval < 0 || c.MaintInterval < 0:
		return invalidConfig("TickerConfig intervals must not be negative")
	}
	return nil
}

// Ticker makes ticks for every queue, re-inserts due retries and runs
// maintenance. Consumers see nothing until a tick covers their events, so
// some process must run a Ticker (or the `pgque ticker` command). Any number
// may run: they elect one leader through the ticker lease, and only the
// leader works.
type Ticker struct {
	client  *Client
	ticker  *tickerd.Ticker
	service startstop.Service
}

// NewTicker returns a Ticker; Start runs it.
func (c *Client) NewTicker(config *TickerConfig) (*Ticker, error) {
	if err := config.validate(); err != nil {
		return nil, err
	}
	cfg := config.withDefaults()
	return &Ticker{client: c, ticker: tickerd.New(tickerd.Config{
		Queries:       c.queries,
		Logger:        c.logger,
		Metrics:       c.metrics,
		OnError:       c.reportError,
		Notifier:      c.notifier,
		Worker:        cfg.WorkerID,
		LeaseTTL:      cfg.LeaseTTL,
		TickInterval:  cfg.TickInterval,
		RetryInterval: cfg.RetryInterval,
		MaintInterval: cfg.MaintInterval,
	})}, nil
}

// tickerFunctions are the functions a Ticker calls. The argument types are
// qualified: a type of the same name earlier on the search_path (a domain
// public.text) must not make a granted function look missing.
var tickerFunctions = []string{
	"pgque.ticker_lead(pg_catalog.text, pg_catalog.interval)", "pgque.ticker_resign(pg_catalog.text)", "pgque.ticker()",
	"pgque.maint_retry_events()", "pgque.maint()", "pgque.maint_route_indexes()",
}

// Start starts the ticker in the background and returns at once. A role
// that may not execute every function the ticker calls gets
// ErrPermissionDenied naming them.
func (t *Ticker) Start(ctx context.Context) error {
	if err := t.client.CheckSchema(ctx); err != nil {
		return err
	}
	// A role without these would start, never lead, and log permission
	// errors forever while no queue ticks: refuse at once and say what is
	// missing.
	missing, role, err := t.client.queries.MissingExecute(ctx, tickerFunctions)
	if err != nil {
		return fmt.Errorf("checking the ticker's privileges: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("starting ticker: role %q may not execute %s (the ticker needs pgque_admin): %w",
			role, strings.Join(missing, ", "), ErrPermissionDenied)
	}
	if err := t.service.Start(ctx, t.ticker.Run); err != nil {
		return fmt.Errorf("starting ticker: %w", ErrAlreadyStarted)
	}
	return nil
}

// Stop stops ticking, resigns the lease so another ticker takes over at
// once, and waits for the goroutine. A lease call in flight is let finish
// first (it is bounded by LeaseTTL); when ctx ends before, the call is
// abandoned and the lease is not resigned, so another ticker takes over
// when it expires. It is idempotent.
func (t *Ticker) Stop(ctx context.Context) error {
	return t.service.Stop(ctx)
}

// IsLeader reports whether this ticker currently leads.
func (t *Ticker) IsLeader() bool { return t.ticker.IsLeader() }
