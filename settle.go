package pgque

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/metrics"
)

// settler acknowledges one chunk: it nacks the failures and acks the chunk
// in one transaction, so that a crash in between cannot leave an event both
// retried and redelivered with its chunk.
type settler struct {
	retryDelay func(retryCount int) time.Duration
	metrics    *metrics.Metrics
	queue      string
	consumer   string
	// nack schedules one failed message; it reports whether the event was
	// retried (false: dead-lettered).
	nack func(ctx context.Context, q *dbq.Queries, m *Message, after time.Duration, reason string) (bool, error)
	// ack acknowledges the chunk and reports whether the batch finished.
	ack func(ctx context.Context, q *dbq.Queries) (bool, error)
	// check, when set, runs in the settling transaction before the nacks
	// and again before the ack (only when there are failures); an error
	// rolls the transaction back, leaving the chunk unacknowledged.
	check func(ctx context.Context, q *dbq.Queries) error
}

// settle runs the nacks and the ack over db (a pool: not inside a
// transaction of the caller's), again when the server rolled them back
// (rerun).
func (s *settler) settle(ctx context.Context, db beginner, failures []failure) error {
	return rerun(ctx, func() error { return s.settleOnce(ctx, db, failures) })
}

// settleOnce runs the nacks and the ack over db: in one transaction when
// there are failures, as one autocommit statement otherwise.
func (s *settler) settleOnce(ctx context.Context, db beginner, failures []failure) error {
	if len(failures) == 0 {
		_, err := s.ack(ctx, dbq.New(db))
		return mapError("acknowledging chunk", err)
	}
	var retried, dead int
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		q := dbq.New(tx)
		retried, dead = 0, 0
		if s.check != nil {
			if err := s.check(ctx, q); err != nil {
				return err
			}
		}
		for _, f := range failures {
			ok, err := s.nack(ctx, q, f.msg, s.delay(f), reason(f.err))
			if err != nil {
				return fmt.Errorf("nacking event %d: %w", f.msg.ID, err)
			}
			if ok {
				retried++
			} else {
				dead++
			}
		}
		if s.check != nil {
			if err := s.check(ctx, q); err != nil {
				return err
			}
		}
		_, err := s.ack(ctx, q)
		return err
	})
	if err != nil {
		return mapError("settling chunk", err)
	}
	s.metrics.Retried.WithLabelValues(s.queue, s.consumer).Add(float64(retried))
	s.metrics.DeadLettered.WithLabelValues(s.queue, s.consumer).Add(float64(dead))
	return nil
}

// settleRuns bounds how many times rerun runs a settling transaction.
const settleRuns = 3

// rerunPause paces rerun: 10 ms, then 20 ms, ±50%.
var rerunPause = backoff.Policy{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: 0.5}

// rerun runs settle, a settling transaction of its own, again when the
// server rolled it back as a deadlock victim (40P01) or a serialization
// failure (40001), at most settleRuns times in all. Nothing of it was
// committed and its fencing still proves the chunk, while a chunk left
// unsettled is delivered again although its handlers have run: another
// session's locks must not cost duplicates.
func rerun(ctx context.Context, settle func() error) error {
	for run := 1; ; run++ {
		err := settle()
		if err == nil || run == settleRuns || !rolledBack(err) || ctx.Err() != nil {
			return err
		}
		if !backoff.Sleep(ctx.Done(), rerunPause.Delay(run-1)) {
			return err
		}
	}
}

// rolledBack reports whether the server refused err's transaction as a
// deadlock victim or a serialization failure.
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// delay is how long a failed message waits: dbq.DeadLetterNow for an error
// made by DeadLetter, what its error asks for with RetryAfter, else the
// consumer's RetryDelay.
func (s *settler) delay(f failure) time.Duration {
	if errors.Is(f.err, ErrDeadLetter) {
		return dbq.DeadLetterNow
	}
	if d, ok := RetryDelayOf(f.err); ok {
		return clampRetryDelay(d)
	}
	return safeRetryDelay(s.retryDelay, f.msg.RetryCount)
}

// beginner is a pool or connection that can open a transaction and run
// single statements.
type beginner interface {
	dbq.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// toMessages converts received rows.
// chunkSeq numbers the chunks received by this process (Message.Chunk).
var chunkSeq atomic.Uint64

func toMessages(rows []dbq.Row, queue, consumer string, slot int) []*Message {
	msgs := make([]*Message, len(rows))
	// One allocation for the chunk's messages, not one each.
	slab := make([]Message, len(rows))
	chunk := chunkSeq.Add(1)
	for i, r := range rows {
		m := &slab[i]
		*m = Message{
			ID: r.MsgID, Queue: queue, Consumer: consumer, Type: r.Type, Payload: r.Payload,
			RetryCount: r.RetryCount, Replay: r.Replay, CreatedAt: r.CreatedAt, BatchID: r.BatchID, Slot: slot,
			Epoch: r.Epoch, Chunk: chunk,
		}
		if r.PartitionKey != nil {
			m.PartitionKey, m.keyed = *r.PartitionKey, true
		}
		msgs[i] = m
	}
	return msgs
}
