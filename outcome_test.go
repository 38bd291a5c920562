package pgque_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// TestDeadLetterAndRetryAfter: a handler error wrapped with DeadLetter
// sends the event to dead_letter on its first delivery (max_retries is
// high), under both failure policies, and the key's later event is still
// delivered; RetryAfter's delay replaces the consumer's RetryDelay.
func TestDeadLetterAndRetryAfter(t *testing.T) {
	for _, policy := range []pgque.FailurePolicy{pgque.FailurePolicySkip, pgque.FailurePolicyPause} {
		t.Run(policy.String(), func(t *testing.T) {
			env := setup(t)
			ctx := context.Background()
			startTicker(t, env.client)
			var poison, later, delayed int64
			var mu sync.Mutex
			seen := map[int64][]time.Time{}
			done := make(chan struct{})
			startProcess(t, env, pgque.PartitionedConsumerConfig{
				Queue: env.queue, Consumer: "c", Slots: 2, FailurePolicy: policy,
				// A consumer backoff of an hour: only RetryAfter can bring
				// the delayed event back within the test.
				RetryDelay: func(int) time.Duration { return time.Hour },
				Handler: func(_ context.Context, m *pgque.Message) error {
					mu.Lock()
					defer mu.Unlock()
					seen[m.ID] = append(seen[m.ID], time.Now())
					switch {
					case string(m.Payload) == `"poison"`:
						return pgque.DeadLetter(errors.New("poison"))
					case string(m.Payload) == `"delayed"` && m.RetryCount == 0:
						return pgque.RetryAfter(errors.New("busy"), 300*time.Millisecond)
					}
					if len(seen[later]) > 0 && len(seen[delayed]) == 2 { // ids are set once both were seen
						select {
						case <-done:
						default:
							close(done)
						}
					}
					return nil
				},
			})
			// The consumer subscribes at the latest tick: send only now.
			p, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: "poison", PartitionKey: "k"})
			if err != nil {
				t.Fatal(err)
			}
			l, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: "later", PartitionKey: "k"})
			if err != nil {
				t.Fatal(err)
			}
			d, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: "delayed", PartitionKey: "d"})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			poison, later, delayed = p, l, d
			mu.Unlock()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				mu.Lock()
				t.Fatalf("timed out: the later event or the delayed retry was not delivered: %v", seen)
			}
			mu.Lock()
			defer mu.Unlock()
			if n := len(seen[poison]); n != 1 {
				t.Errorf("poison event delivered %d times, want 1", n)
			}
			if gap := seen[delayed][1].Sub(seen[delayed][0]); gap < 300*time.Millisecond {
				t.Errorf("delayed event redelivered after %v, want at least the 300ms asked for", gap)
			}
			var id int64
			var retry int
			var reason string
			if err := env.pool.QueryRow(ctx, `select ev_id, ev_retry, reason from pgque.dlq_list($1, null, 10)`, env.queue).Scan(&id, &retry, &reason); err != nil {
				t.Fatal(err)
			}
			if id != poison || retry != 0 || reason == "" {
				t.Errorf("dead letter = (%d, retry %d, %q), want (%d, retry 0, a reason)", id, retry, reason, poison)
			}
		})
	}
}
