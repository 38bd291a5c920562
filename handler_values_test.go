package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// errorTexts are handler error texts PostgreSQL text cannot hold as they
// are, or that are cut inside a multi-byte rune at the reason limit.
var errorTexts = []struct{ name, text string }{
	{"nul", "boom\x00after nul"},
	{"only nul", "\x00"},
	{"invalid utf8", "bad \xff\xfe bytes"},
	{"lone continuation", "\x80\x80\x80"},
	{"surrogate half", "\xed\xa0\x80"},
	{"truncated rune", "ends in \xe2\x82"},
	{"rune across the cap", strings.Repeat("a", pgque.ReasonMaxBytes-1) + "€ tail"},
	{"emoji across the cap", strings.Repeat("b", pgque.ReasonMaxBytes-2) + "😀😀"},
	{"huge", strings.Repeat("é", 1<<20)},
	{"huge with nul", strings.Repeat("x\x00", 1<<16)},
}

// consumerKinds starts a plain or a partitioned consumer over env with
// handler h and retry delay rd.
var consumerKinds = []struct {
	name  string
	start func(t *testing.T, env *testEnv, queue string, h pgque.HandlerFunc, rd func(int) time.Duration)
}{
	{"plain", func(t *testing.T, env *testEnv, queue string, h pgque.HandlerFunc, rd func(int) time.Duration) {
		startConsumer(t, env, &pgque.ConsumerConfig{Queue: queue, Consumer: "c", Handler: h, RetryDelay: rd,
			PollInterval: 50 * time.Millisecond})
	}},
	{"partitioned", func(t *testing.T, env *testEnv, queue string, h pgque.HandlerFunc, rd func(int) time.Duration) {
		pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "p", Slots: 2,
			Handler: h, RetryDelay: rd, PollInterval: 50 * time.Millisecond, ClaimInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := pc.Stop(ctx); err != nil {
				t.Error("stopping partitioned consumer:", err)
			}
		})
	}},
}

// TestHandlerErrorTextsNeverWedgeSettle: whatever text a handler's error
// carries, the failed event is dead-lettered (max_retries 0) with a
// storable reason, and the consumer goes on to the next event.
func TestHandlerErrorTextsNeverWedgeSettle(t *testing.T) {
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	for _, kind := range consumerKinds {
		for i, et := range errorTexts {
			t.Run(kind.name+"/"+et.name, func(t *testing.T) {
				queue := fmt.Sprintf("%s_txt_%d", kind.name, i)
				if _, err := env.client.CreateQueue(ctx, queue); err != nil {
					t.Fatal(err)
				}
				if err := env.client.SetQueueConfig(ctx, queue, pgque.QueueMaxRetries(0)); err != nil {
					t.Fatal(err)
				}
				var after atomic.Int64
				kind.start(t, env, queue, func(_ context.Context, m *pgque.Message) error {
					if m.Type == "fail" {
						return errors.New(et.text)
					}
					after.Add(1)
					return nil
				}, nil)
				if _, err := env.client.Send(ctx, queue, pgque.Event{Type: "fail", Payload: 1, PartitionKey: "k"}); err != nil {
					t.Fatal(err)
				}
				var reason string
				pgtest.WaitFor(t, 20*time.Second, "the dead letter", func() bool {
					err := env.pool.QueryRow(ctx, `select d.dl_reason from pgque.dead_letter d join pgque.queue q on q.queue_id = d.dl_queue
						where q.queue_name = $1`, queue).Scan(&reason)
					return err == nil
				})
				if !utf8.ValidString(reason) || strings.ContainsRune(reason, 0) || len(reason) > pgque.ReasonMaxBytes || reason == "" {
					t.Fatalf("stored reason is not sane: %d bytes, valid %v", len(reason), utf8.ValidString(reason))
				}
				if _, err := env.client.Send(ctx, queue, pgque.Event{Type: "ok", Payload: 2, PartitionKey: "k"}); err != nil {
					t.Fatal(err)
				}
				pgtest.WaitFor(t, 20*time.Second, "the next event", func() bool { return after.Load() == 1 })
			})
		}
	}
}

// TestRetryDelaysAreClampedNotFatal: a RetryDelay returning a negative,
// absurd or panicking result still nacks the event: it comes back (at
// once, or after the default delay) or waits at most RetryDelayMax.
func TestRetryDelaysAreClampedNotFatal(t *testing.T) {
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	delays := []struct {
		name  string
		rd    func(int) time.Duration
		comes bool // redelivered within the test
	}{
		{"negative", func(int) time.Duration { return -time.Hour }, true},
		{"min int64", func(int) time.Duration { return math.MinInt64 }, true},
		{"panics", func(int) time.Duration { panic("retry delay bug") }, true},
		{"max int64", func(int) time.Duration { return math.MaxInt64 }, false},
		{"a century", func(int) time.Duration { return 100 * 365 * 24 * time.Hour }, false},
	}
	for _, kind := range consumerKinds {
		for i, d := range delays {
			t.Run(kind.name+"/"+d.name, func(t *testing.T) {
				queue := fmt.Sprintf("%s_rd_%d", kind.name, i)
				if _, err := env.client.CreateQueue(ctx, queue); err != nil {
					t.Fatal(err)
				}
				var seen, retried atomic.Int64
				kind.start(t, env, queue, func(_ context.Context, m *pgque.Message) error {
					seen.Add(1)
					if m.RetryCount == 0 {
						return errors.New("first try fails")
					}
					retried.Add(1)
					return nil
				}, d.rd)
				if _, err := env.client.Send(ctx, queue, pgque.Event{Payload: 1, PartitionKey: "k"}); err != nil {
					t.Fatal(err)
				}
				if d.comes {
					waitOrDescribe(t, env, queue, 20*time.Second, "the retry", func() bool { return retried.Load() == 1 },
						func() string { return fmt.Sprintf("the handler ran %d times", seen.Load()) })
					return
				}
				var ahead float64 // seconds
				var lastErr error
				waitOrDescribe(t, env, queue, 20*time.Second, "the retry row", func() bool {
					lastErr = env.pool.QueryRow(ctx, `select extract(epoch from r.ev_retry_after - now())::float8
						from pgque.retry_queue r join pgque.queue q on q.queue_id = r.ev_queue where q.queue_name = $1`, queue).
						Scan(&ahead)
					return lastErr == nil
				}, func() string { return fmt.Sprintf("the handler ran %d times; the last read: %v", seen.Load(), lastErr) })
				until := time.Duration(ahead * float64(time.Second))
				if until > pgque.RetryDelayMax || until < pgque.RetryDelayMax-time.Hour {
					t.Fatalf("retry scheduled %v ahead, want about RetryDelayMax (%v)", until, pgque.RetryDelayMax)
				}
				if n := seen.Load(); n != 1 {
					t.Fatalf("handler saw the event %d times, want once (no redelivery loop)", n)
				}
			})
		}
	}
}
