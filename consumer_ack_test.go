package pgque_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// The Consumer acknowledges a chunk handled without failures with its next
// receive (receive_raw's ack_batch): draining batches of one chunk each
// appends one state record per batch, plus one for the receive that
// acknowledges the last and finds nothing, where a separate ack would
// append two per batch. Payloads reach the handler as the JSON sent.
func TestConsumerAcksWithTheNextReceive(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	if _, err := env.client.Receiver(nil).Subscribe(ctx, env.queue, "c"); err != nil {
		t.Fatal(err)
	}
	const batches, perBatch = 5, 3
	want := map[string]bool{}
	for b := range batches {
		var events []pgque.Event
		for i := range perBatch {
			p := fmt.Sprintf(`{"b":%d,"i":%d}`, b, i)
			want[p] = true
			events = append(events, pgque.Event{Payload: json.RawMessage(p)})
		}
		if _, err := env.client.SendBatch(ctx, env.queue, events); err != nil {
			t.Fatal(err)
		}
		err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", env.queue); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "select pgque.ticker($1)", env.queue)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	records := func() int64 {
		var n int64
		err := env.pool.QueryRow(ctx, `select count(*) from pgque.sub_state st
			join pgque.subscription s on s.sub_id = st.st_sub join pgque.queue q on q.queue_id = s.sub_queue
			where q.queue_name = $1 and s.sub_name = 'c'`, env.queue).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := records()
	c := &collector{}
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "c", Handler: c.handle,
		BatchSize: perBatch, PollInterval: 50 * time.Millisecond})
	got := c.wait(t, batches*perBatch)
	pgtest.WaitFor(t, 20*time.Second, "the last batch acknowledged", func() bool {
		subs, err := env.client.Consumers(ctx, env.queue)
		return err == nil && len(subs) == 1 && subs[0].OpenBatch == nil
	})
	if len(got) != batches*perBatch {
		t.Fatalf("handled %d events, want %d", len(got), batches*perBatch)
	}
	for _, m := range got {
		var b bytes.Buffer
		if err := json.Compact(&b, m.Payload); err != nil || !want[b.String()] {
			t.Fatalf("handler got payload %s (%v), not one that was sent", m.Payload, err)
		}
	}
	if n := records() - before; n != batches+1 {
		t.Fatalf("draining %d one-chunk batches appended %d state records, want %d (each acknowledgement folded into the next receive)",
			batches, n, batches+1)
	}
}

// TestConsumerStopLetsTheAckingReceiveLand: a Consumer stopped while the
// receive that acknowledges its last chunk waits lets that receive land,
// so the chunk it handled is not delivered again. Cancelled instead, the
// acknowledgement is lost and the next consumer of the name gets the chunk
// again. The receive waits on the subscription's row, which the test holds
// locked from the handler's return.
func TestConsumerStopLetsTheAckingReceiveLand(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	startTicker(t, env.client)
	handling, locked := make(chan struct{}), make(chan struct{})
	con, err := env.client.NewConsumer(&pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
		Handler: func(context.Context, *pgque.Message) error {
			close(handling)
			<-locked
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer con.Stop(ctx)
	first, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-handling:
	case <-time.After(20 * time.Second):
		t.Fatal("the first event was not delivered within 20 s")
	}
	holder, err := env.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `select 1 from pgque.subscription s join pgque.queue q on q.queue_id = s.sub_queue
		where q.queue_name = $1 and s.sub_name = 'c' for no key update`, env.queue); err != nil {
		t.Fatal(err)
	}
	close(locked)
	waitingReceives := func() int { return lockWaiters(t, env, "receive_raw") }
	pgtest.WaitFor(t, 10*time.Second, "the acknowledging receive to wait on the subscription", func() bool { return waitingReceives() == 1 })
	stopLetsFinish(t, env, holder, con.Stop, func() <-chan struct{} { return pgque.ConsumerStopping(con) },
		"the receive carrying the acknowledgement", func() bool { return waitingReceives() >= 1 })
	// The next consumer of the name gets the second event, not the first
	// again: chunks come in order, so the first would come before it.
	got := make(chan int64, 10)
	startConsumer(t, env, &pgque.ConsumerConfig{Queue: env.queue, Consumer: "c",
		Handler: func(_ context.Context, m *pgque.Message) error {
			got <- m.ID
			return nil
		}})
	second, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 2})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != second {
			t.Fatalf("the next consumer got event %d first, want %d (the first, %d, was handled and acknowledged)", id, second, first)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the second event was not delivered within 20 s")
	}
}
