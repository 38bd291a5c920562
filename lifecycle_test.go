package pgque_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgque/pgque"
)

// TestStopIsBoundedWhenAHandlerIgnoresCtx: a handler that never looks at
// its context cannot hold Stop past its deadline (plus the abandon wait):
// Stop returns an error that wraps the deadline and names the handler's
// event, for a plain and for a partitioned consumer.
func TestStopIsBoundedWhenAHandlerIgnoresCtx(t *testing.T) {
	env := setup(t)
	startTicker(t, env.client)
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release)
	for _, kind := range []string{"plain", "partitioned"} {
		t.Run(kind, func(t *testing.T) {
			queue := "stuck_" + kind
			if _, err := env.client.CreateQueue(ctx, queue); err != nil {
				t.Fatal(err)
			}
			var started atomic.Int64
			h := func(_ context.Context, m *pgque.Message) error {
				started.Store(m.ID)
				<-release // ignores ctx
				return nil
			}
			var stop func(context.Context) error
			if kind == "plain" {
				con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: queue, Consumer: "c", Handler: h, PollInterval: 50 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if err := con.Start(ctx); err != nil {
					t.Fatal(err)
				}
				stop = con.Stop
			} else {
				pc, err := env.client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{Queue: queue, Consumer: "p", Slots: 2,
					Handler: h, PollInterval: 50 * time.Millisecond, ClaimInterval: 100 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				if err := pc.Start(ctx); err != nil {
					t.Fatal(err)
				}
				stop = pc.Stop
			}
			id, err := env.client.Send(ctx, queue, pgque.Event{Payload: 1, PartitionKey: "k"})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 20*time.Second, "the handler to start", func() bool { return started.Load() == id })
			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			begin := time.Now()
			err = stop(sctx)
			took := time.Since(begin)
			if took > 300*time.Millisecond+3*time.Second {
				t.Fatalf("Stop took %v with a handler ignoring ctx", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "event "+strconv.FormatInt(id, 10)) {
				t.Fatalf("Stop = %v, want DeadlineExceeded naming event %d", err, id)
			}
		})
	}
}
