package pgque

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

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

// settle runs the nacks and the ack over db: in one transaction when there
// are failures, as one autocommit statement otherwise.
func (s *settler) settle(ctx context.Context, db beginner, failures []failure) error {
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
