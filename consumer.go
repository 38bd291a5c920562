package pgque

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/startstop"
	"github.com/pgque/pgque/internal/wakeup"
	"github.com/pgque/pgque/internal/workerpool"
)

// Consumer consumes one plain subscription: chunk by chunk, each message in
// ev_id order, one goroutine. Create it with Client.NewConsumer.
type Consumer struct {
	client  *Client
	config  ConsumerConfig
	invoker invoker
	settler settler
	service startstop.Service
	// pendingAck is the batch whose last chunk was handled without failures
	// and is acknowledged by the next receive (receive_raw's ack_batch), so
	// a chunk costs one round trip. Only the run goroutine touches it.
	pendingAck *int64
}

// NewConsumer returns a Consumer; Start runs it.
func (c *Client) NewConsumer(config *ConsumerConfig) (*Consumer, error) {
	if err := config.validate(); err != nil {
		return nil, err
	}
	cfg := config.withDefaults()
	con := &Consumer{client: c, config: cfg}
	complete := func(ctx context.Context, q *dbq.Queries, m *Message) error {
		return q.CompleteInTx(ctx, cfg.Queue, cfg.Consumer, m.BatchID, m.ID)
	}
	con.invoker = invoker{handler: handlerOf(cfg.Handler, cfg.HandlerTx, c.pool, complete), queue: cfg.Queue, consumer: cfg.Consumer, logger: c.logger, metrics: c.metrics,
		observer: c.config.Observer, timeout: cfg.HandlerTimeout, inFlight: &inFlight{}}
	con.service.Running = con.invoker.inFlight.list
	con.settler = settler{
		retryDelay: cfg.RetryDelay, metrics: c.metrics, queue: cfg.Queue, consumer: cfg.Consumer,
		nack: func(ctx context.Context, q *dbq.Queries, m *Message, after time.Duration, reason string) (bool, error) {
			return q.Nack(ctx, m.BatchID, m.ID, after, reason)
		},
	}
	return con, nil
}

// Start subscribes (idempotently) and starts consuming in the background. It
// returns at once. Cancelling ctx abandons the work in flight, like a crash:
// prefer Stop.
func (con *Consumer) Start(ctx context.Context) error {
	if err := con.client.CheckSchema(ctx); err != nil {
		return err
	}
	if _, err := con.client.queries.Subscribe(ctx, con.config.Queue, con.config.Consumer); err != nil {
		return mapError(fmt.Sprintf("subscribing %q to queue %q", con.config.Consumer, con.config.Queue), err)
	}
	if err := con.service.Start(ctx, con.run); err != nil {
		return fmt.Errorf("starting consumer %q: %w", con.config.Consumer, ErrAlreadyStarted)
	}
	return nil
}

// Stop stops receiving, lets the chunk in flight finish and be acked, and
// returns when the consumer's goroutines are gone. If ctx ends first, the
// chunk is abandoned unacked (it is redelivered later) and ctx's error is
// returned. A handler that ignores its
// cancelled context does not hold Stop: one second later Stop returns an
// error that wraps ctx's and names the handlers still running (their
// goroutines exit when they return). Stop is idempotent.
func (con *Consumer) Stop(ctx context.Context) error {
	return con.service.Stop(ctx)
}

// run is the consumer's goroutine: receive, handle, settle, repeat; wait for
// a notification or the poll when there is nothing to do.
func (con *Consumer) run(fetchCtx, workCtx context.Context) {
	waiter := wakeup.Waiter{Poll: con.config.PollInterval, Jitter: 0.2}
	if n := con.client.notifier; n != nil {
		tag := workerpool.TickTag(con.config.Queue)
		sub := n.Listen(workerpool.TickChannel, func(payload string) bool { return payload == tag })
		defer sub.Unlisten()
		waiter.Notify = sub.C()
	}
	log := con.client.logger.With(slog.String("queue", con.config.Queue), slog.String("consumer", con.config.Consumer))
	defer con.flushAck(workCtx, log)
	for failures := 0; fetchCtx.Err() == nil; {
		more, err := con.chunk(fetchCtx, workCtx)
		switch {
		case workCtx.Err() != nil || fetchCtx.Err() != nil:
			return
		case err != nil:
			log.WarnContext(fetchCtx, "pgque: consuming", slog.Any("error", err))
			con.client.reportError(fetchCtx, err)
			backoff.Sleep(fetchCtx.Done(), backoff.Errors.Delay(failures))
			failures++
		case more:
			failures = 0
		default:
			failures = 0
			_ = waiter.Wait(fetchCtx)
		}
	}
}

// chunk receives and processes one chunk; it reports whether there may be
// more work right away. A chunk handled without failures is acknowledged
// by the next receive, in the same statement; one with failures is settled
// at once (nacks and ack in one transaction).
func (con *Consumer) chunk(fetchCtx, workCtx context.Context) (bool, error) {
	start := time.Now()
	ack := con.pendingAck
	// Whatever the receive does, the pending ack is not sent again: when
	// the statement fails it rolled back, and the chunk is redelivered, as
	// after any failed ack. Sending it again would not be safe anyway: it
	// acknowledges whichever chunk of the batch was received last, and
	// after a receive that landed unseen that is one never handled.
	con.pendingAck = nil
	// So a receive that carries an ack runs under workCtx: a graceful stop
	// lets it land rather than cancel it, which would redeliver the chunk
	// just handled (or leave the server to run the call anyway). What it
	// returns after a stop is left unhandled: the same chunk comes back
	// to the consumer's next receive.
	rctx := fetchCtx
	if ack != nil {
		rctx = workCtx
	}
	rows, err := con.client.queries.ReceiveRaw(rctx, con.config.Queue, con.config.Consumer, con.config.BatchSize, ack)
	if err != nil {
		return false, mapError("receiving", err)
	}
	if len(rows) == 0 || fetchCtx.Err() != nil {
		return false, nil
	}
	msgs := toMessages(rows, con.config.Queue, con.config.Consumer, 0)
	run := con.invoker.handleChunk(workCtx, msgs, false, nil)
	failures := run.failures
	if run.aborted {
		return false, errors.Join(errAborted, workCtx.Err())
	}
	batchID := rows[0].BatchID
	if len(failures) == 0 {
		con.pendingAck = &batchID
	} else {
		s := con.settler
		s.ack = func(ctx context.Context, q *dbq.Queries) (bool, error) { return q.Ack(ctx, batchID) }
		if err := s.settle(workCtx, con.client.pool, failures); err != nil {
			return false, err
		}
	}
	con.client.metrics.BatchDuration.WithLabelValues(con.config.Queue, con.config.Consumer).Observe(time.Since(start).Seconds())
	return true, nil
}

// flushAck sends the pending acknowledgement on its own when the consumer
// stops, so that the last chunk handled is not redelivered.
func (con *Consumer) flushAck(ctx context.Context, log *slog.Logger) {
	if con.pendingAck == nil || ctx.Err() != nil {
		return
	}
	batchID := *con.pendingAck
	con.pendingAck = nil
	if _, err := con.client.queries.Ack(ctx, batchID); err != nil {
		err = mapError("acknowledging chunk", err)
		log.WarnContext(ctx, "pgque: consuming", slog.Any("error", err))
		con.client.reportError(ctx, err)
	}
}

// errAborted marks a chunk abandoned because its work context ended.
var errAborted = errors.New("chunk abandoned unacked")
