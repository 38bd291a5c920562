package pgque

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/dbq"
)

// QueueConfig holds a queue's settings, in SetQueueConfig's terms.
type QueueConfig struct {
	TickerMaxCount   int
	TickerMaxLag     time.Duration
	TickerIdlePeriod time.Duration
	RotationPeriod   time.Duration
	MaxRetries       int
}

// QueueSetting is one queue parameter and its value, for SetQueueConfig.
// Make one with QueueTickerMaxCount, QueueTickerMaxLag,
// QueueTickerIdlePeriod, QueueRotationPeriod, QueueMaxRetries or
// QueueDedupWindow, or with QueueParam for a parameter given by name.
type QueueSetting struct {
	param, value string
}

// String returns the setting as param=value.
func (s QueueSetting) String() string { return s.param + "=" + s.value }

// QueueTickerMaxCount makes the ticker close a batch after n events (at
// least 1).
func QueueTickerMaxCount(n int) QueueSetting { return queueInt("ticker_max_count", n) }

// QueueTickerMaxLag makes the ticker close a batch once its oldest event
// has waited d (0 to a day).
func QueueTickerMaxLag(d time.Duration) QueueSetting { return queueInterval("ticker_max_lag", d) }

// QueueTickerIdlePeriod makes the ticker tick an idle queue every d (more
// than 0, at most a day).
func QueueTickerIdlePeriod(d time.Duration) QueueSetting {
	return queueInterval("ticker_idle_period", d)
}

// QueueRotationPeriod makes the queue switch event tables every d (more
// than 0, at most 365 days).
func QueueRotationPeriod(d time.Duration) QueueSetting { return queueInterval("rotation_period", d) }

// QueueMaxRetries dead-letters an event after n failed retries (0: at its
// first failure).
func QueueMaxRetries(n int) QueueSetting { return queueInt("max_retries", n) }

// QueueDedupWindow makes the queue remember a dedup key for d (see
// Client.DedupWindow).
func QueueDedupWindow(d time.Duration) QueueSetting { return queueInterval("dedup_window", d) }

// QueueParam is a setting by name, with its value as set_queue_config reads
// it (an integer, or an interval such as "10 ms"): for a parameter given as
// text, on a command line or in a file.
func QueueParam(name, value string) QueueSetting { return QueueSetting{param: name, value: value} }

func queueInt(param string, n int) QueueSetting {
	return QueueSetting{param: param, value: strconv.Itoa(n)}
}

// queueInterval spells d as an interval, to the microsecond (PostgreSQL's
// resolution), in seconds with a fraction: PostgreSQL 14 reads a count of
// microseconds as a 32-bit field, so "10800000000 microseconds" (3 h) is
// out of range there.
func queueInterval(param string, d time.Duration) QueueSetting {
	us, sign := d.Microseconds(), ""
	if us < 0 {
		us, sign = -us, "-"
	}
	return QueueSetting{param: param, value: fmt.Sprintf("%s%d.%06d seconds", sign, us/1e6, us%1e6)}
}

// SetQueueConfig sets queue parameters, all of them or (on an error) none.
// A value out of range fails with ErrInvalidArgument, an unknown parameter
// with ErrUnknownParameter. Requires the pgque_admin role.
func (c *Client) SetQueueConfig(ctx context.Context, queue string, settings ...QueueSetting) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		return c.SetQueueConfigTx(ctx, tx, queue, settings...)
	})
}

// SetQueueConfigTx is SetQueueConfig inside the caller's transaction, so
// that the settings change with the caller's other work or not at all.
func (c *Client) SetQueueConfigTx(ctx context.Context, tx pgx.Tx, queue string, settings ...QueueSetting) error {
	q := dbq.New(tx)
	for _, s := range settings {
		if err := q.SetQueueConfig(ctx, queue, s.param, s.value); err != nil {
			return mapError(fmt.Sprintf("setting %s of queue %q", s.param, queue), err)
		}
	}
	return nil
}

// DedupWindow returns how long queue remembers a dedup key (its
// dedup_window setting, 5 minutes unless set). Requires pgque_admin. It
// fails with ErrQueueNotFound for an unknown queue.
func (c *Client) DedupWindow(ctx context.Context, queue string) (time.Duration, error) {
	w, ok, err := c.queries.DedupWindow(ctx, queue)
	if err != nil {
		return 0, mapError(fmt.Sprintf("reading the dedup window of queue %q", queue), err)
	}
	if !ok {
		return 0, fmt.Errorf("reading the dedup window of queue %q: %w", queue, ErrQueueNotFound)
	}
	return w, nil
}
