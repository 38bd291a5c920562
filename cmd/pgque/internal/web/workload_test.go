package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Keys of the workload. The hostile key ends up dead-lettered; its payload
// and key are markup that must never be interpreted.
const (
	queueName   = "files"
	stuckKey    = "tenant-stuck"
	hotKey      = "tenant-hot"
	hostileKey  = `<img src=x onerror="document.body.dataset.pwned=1">`
	hostileData = `{"name": "<script>document.body.dataset.pwned=1</script><img src=x onerror=\"document.body.dataset.pwned=1\">"}`
	testToken   = "0123456789abcdef0123456789abcdef"
)

// workload is a running multi-tenant stream: a ticker, a producer, a
// partitioned consumer "indexer" (pause policy; tenant-stuck's first event
// fails, so the key stays blocked for an hour; tenant-hot is slow, so its
// slot backs up) and "thumbnails" (skip policy; the hostile key always
// fails and is dead-lettered after one retry).
type workload struct {
	pool   *pgxpool.Pool
	client *pgque.Client
}

func startWorkload(t *testing.T) *workload {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewInstalledDB(t))
	logger := slog.New(slog.DiscardHandler)
	client, err := pgque.NewClient(pool, &pgque.Config{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	if _, err := client.CreateQueue(ctx, queueName); err != nil {
		t.Fatal(err)
	}
	if err := client.SetQueueConfig(ctx, queueName, pgque.QueueMaxRetries(1)); err != nil {
		t.Fatal(err)
	}
	w := &workload{pool: pool, client: client}

	ticker, err := client.NewTicker(&pgque.TickerConfig{TickInterval: 50 * time.Millisecond, RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w.start(t, ticker)
	indexer, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: queueName, Consumer: "indexer", Slots: 4, FailurePolicy: pgque.FailurePolicyPause,
		ClaimInterval: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		RetryDelay: func(int) time.Duration { return time.Hour },
		Handler: func(ctx context.Context, m *pgque.Message) error {
			switch {
			case m.PartitionKey == stuckKey && strings.Contains(string(m.Payload), `"fail"`):
				return errors.New("thumbnail service: 503 Service Unavailable")
			case m.PartitionKey == hotKey:
				_ = pgtest.Work(ctx, 4*time.Millisecond) // the hot key's handler takes time: it is what the console shows
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.start(t, indexer)
	thumbnails, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: queueName, Consumer: "thumbnails", Slots: 2,
		ClaimInterval: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		RetryDelay: func(int) time.Duration { return 10 * time.Millisecond },
		Handler: func(ctx context.Context, m *pgque.Message) error {
			if m.PartitionKey == hostileKey {
				return errors.New(`decoder: unexpected "<" in payload`)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	w.start(t, thumbnails)

	// The producer: steady traffic over a few tenants, a hot tenant, one
	// failing event for tenant-stuck followed by ordinary ones, and one
	// hostile event.
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; pctx.Err() == nil; i++ {
			var evs []pgque.Event
			for k := range 5 {
				evs = append(evs, pgque.Event{Type: "FileCreated", Payload: map[string]int{"n": i}, PartitionKey: fmt.Sprintf("tenant-%d", k)})
			}
			for range 6 {
				evs = append(evs, pgque.Event{Type: "FileOverwritten", Payload: map[string]int{"n": i}, PartitionKey: hotKey})
			}
			switch {
			case i == 0:
				evs = append(evs, pgque.Event{Type: "FileDeleted", Payload: map[string]bool{"fail": true}, PartitionKey: stuckKey})
			case i < 5:
				evs = append(evs, pgque.Event{Type: "FileCreated", Payload: map[string]int{"n": i}, PartitionKey: stuckKey})
			case i == 5:
				evs = append(evs, pgque.Event{Type: "FileCreated", Payload: json.RawMessage(hostileData), PartitionKey: hostileKey})
			}
			if _, err := client.SendBatch(pctx, queueName, evs); err != nil && pctx.Err() == nil {
				t.Errorf("producer: %v", err)
				return
			}
			select {
			case <-pctx.Done():
			case <-time.After(25 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stop(); wg.Wait() })
	return w
}

// service is what start runs.
type service interface {
	Start(context.Context) error
	Stop(context.Context) error
}

func (w *workload) start(t *testing.T, s service) {
	t.Helper()
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
}

// serve starts a console over the workload on a loopback test server, with
// its sampler.
func (w *workload) serve(t *testing.T, actions bool) *httptest.Server {
	t.Helper()
	cfg := Config{Client: w.client, SampleInterval: 200 * time.Millisecond}
	if actions {
		cfg.AllowActions, cfg.Token = true, testToken
	}
	return serveConsole(t, cfg)
}

// blockedKey reports whether key is blocked for indexer.
func (w *workload) blockedKey(t *testing.T, key string) bool {
	t.Helper()
	bks, err := w.client.BlockedKeys(context.Background(), queueName, "indexer")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bks {
		if v, ok := b.Key.Value(); ok && v == key && b.State == pgque.BlockStateBlocked {
			return true
		}
	}
	return false
}

// deadLetters returns the queue's dead letters.
func (w *workload) deadLetters(t *testing.T) []pgque.DeadLetterEntry {
	t.Helper()
	dls, err := w.client.DeadLetters(context.Background(), queueName, &pgque.DeadLetterFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return dls
}
