package pgque_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// syncBuffer is a bytes.Buffer safe for the pool's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// argTracer prints every statement's arguments the way a logging tracer
// would, and picks out the lease tokens among them (they let the test
// know the secret it must not find anywhere).
type argTracer struct {
	printed syncBuffer
	mu      sync.Mutex
	tokens  map[string]bool
}

func (tr *argTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	fmt.Fprintf(&tr.printed, "%s %v %+v\n", data.SQL, data.Args, data.Args)
	for _, a := range data.Args {
		if s, ok := a.(interface{ Secret() string }); ok && s.Secret() != "" {
			tr.mu.Lock()
			tr.tokens[s.Secret()] = true
			tr.mu.Unlock()
		}
	}
	return ctx
}

func (tr *argTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestLeaseTokenNeverLogged: a pool that works a slot, has its lease taken
// over (every later call of it is refused with PQ085), and stops, logs at
// debug level, reports errors and passes statement arguments to a tracer
// without ever showing its lease token.
func TestLeaseTokenNeverLogged(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		t.Fatal(err)
	}
	tracer := &argTracer{tokens: map[string]bool{}}
	pcfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var logs, errs syncBuffer
	client, err := pgque.NewClient(pool, &pgque.Config{
		Logger:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnError: func(_ context.Context, err error) { fmt.Fprintf(&errs, "%v %+v\n", err, err) },
	})
	if err != nil {
		t.Fatal(err)
	}
	startFastTicker(t, env.client)
	var handled sync.Map
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 1, WorkerID: "w-log", LeaseTTL: 2 * time.Second,
		PollInterval: 50 * time.Millisecond,
		Handler: func(_ context.Context, m *pgque.Message) error {
			handled.Store(m.ID, true)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := env.client.Send(ctx, env.queue, pgque.Event{Payload: 1, PartitionKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the first event to be handled", func() bool { _, ok := handled.Load(id); return ok })
	// Once the lease is bound to the pool's LISTEN session, no renewal
	// that binds it can come before the receive the test waits for.
	pgtest.WaitFor(t, 20*time.Second, "the lease bound to the pool's session", func() bool {
		var bound bool
		return env.pool.QueryRow(ctx, "select sl_session is not null from pgque.slot_lease where sl_consumer = 'c'").Scan(&bound) == nil && bound
	})

	// Another worker takes the lease over, as after an expiry (the test
	// writes the takeover as the owner of the tables, so that the pool
	// cannot claim the slot back in between); the pool's next calls are
	// refused.
	thief := pgque.SlotLease{Queue: env.queue, Consumer: "c", Slot: 0, Worker: "thief",
		Token: pgque.LeaseToken("7a1e0c52-9d4b-4f3e-8c21-5b6a7d8e9f01")}
	if err := env.pool.QueryRow(ctx, `update pgque.slot_lease set sl_owner = 'thief', sl_until = now() + interval '1 minute',
		sl_epoch = sl_epoch + 1, sl_token = pgque._token_hash($1::uuid) where sl_consumer = 'c' returning sl_epoch`,
		thief.Token.Secret()).Scan(&thief.Epoch); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the pool to be refused", func() bool { return strings.Contains(logs.String(), "PQ085") })
	if _, err := env.client.Receiver(nil).ReleaseSlot(ctx, thief); err != nil {
		t.Fatalf("thief's release: %v", err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the pool to claim the slot again", func() bool { return len(pc.OwnedSlots()) == 1 })
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pc.Stop(sctx); err != nil {
		t.Fatal(err)
	}

	tracer.mu.Lock()
	defer tracer.mu.Unlock()
	if len(tracer.tokens) < 2 {
		t.Fatalf("the tracer saw %d lease tokens, want the first lease's and the re-claimed one's", len(tracer.tokens))
	}
	for tok := range tracer.tokens {
		for what, text := range map[string]string{"log": logs.String(), "reported errors": errs.String(), "printed arguments": tracer.printed.String()} {
			if strings.Contains(text, tok) {
				t.Errorf("the %s show a lease token", what)
			}
		}
	}
	if s := fmt.Sprintf("%v %+v %#v %s", thief, thief, thief, thief.Token); strings.Contains(s, thief.Token.Secret()) {
		t.Errorf("a SlotLease prints its token: %s", s)
	}
	if !strings.Contains(tracer.printed.String(), "[redacted]") {
		t.Error("the printed arguments show no redacted token: the test saw no token argument")
	}
}

// A LeaseToken prints redacted on every path a lease takes into a log, an
// error or a document; only Secret gives its value.
func TestLeaseTokenRedacts(t *testing.T) {
	t.Parallel()
	const secret = "7a1e0c52-9d4b-4f3e-8c21-5b6a7d8e9f01"
	lease := pgque.SlotLease{Queue: "q", Consumer: "c", Worker: "w", Token: pgque.LeaseToken(secret)}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("lease", slog.Any("token", lease.Token), slog.Any("lease", lease))
	doc, err := json.Marshal(lease)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{
		"%v":   fmt.Sprintf("%v", lease),
		"%+v":  fmt.Sprintf("%+v", lease),
		"%#v":  fmt.Sprintf("%#v", lease),
		"%s":   fmt.Sprintf("%s", lease.Token),
		"%q":   fmt.Sprintf("%q", lease.Token),
		"%x":   fmt.Sprintf("%x", lease.Token),
		"err":  fmt.Errorf("claiming: %v", lease.Token).Error(),
		"slog": logged.String(),
		"json": string(doc),
	} {
		if strings.Contains(s, secret) || strings.Contains(s, fmt.Sprintf("%x", secret)) {
			t.Errorf("%s shows the token: %s", name, s)
		}
	}
	if lease.Token.Secret() != secret {
		t.Errorf("Secret() = %q", lease.Token.Secret())
	}
}
