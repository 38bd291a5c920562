package pgque_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgque/pgque"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	env := setup(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	client, err := pgque.NewClient(env.pool, &pgque.Config{Registerer: reg, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	startTicker(t, client)
	var chk checker
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: env.queue, Consumer: "c", Slots: 2, ClaimInterval: 100 * time.Millisecond,
		Handler: func(_ context.Context, m *pgque.Message) error { defer chk.begin("w", m)(); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pc.Stop(ctx)
	events := []pgque.Event{{Payload: 1, PartitionKey: "a"}, {Payload: 2, PartitionKey: "b"}, {Payload: 3, PartitionKey: "c"}}
	if _, err := client.SendBatch(ctx, env.queue, events); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "all events", func() bool { return chk.distinct() == 3 })

	wants := []string{
		`pgque_events_sent_total{queue="` + env.queue + `"} 3`,
		`pgque_events_processed_total{consumer="c",queue="` + env.queue + `"} 3`,
		`pgque_lease_claims_total{consumer="c",queue="` + env.queue + `"} 2`,
		`pgque_handler_duration_seconds_count{consumer="c",queue="` + env.queue + `"} 3`,
		`pgque_slot_lag_events{consumer="c",queue="` + env.queue + `",slot="0"}`,
		`pgque_ticker_leader 1`,
	}
	// The slot gauges come from a refresher that may not have run yet.
	var body string
	complete := func() bool {
		body = scrape(t, client)
		for _, want := range wants {
			if !strings.Contains(body, want) {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(10 * time.Second)
	for !complete() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range wants {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	families, err := reg.Gather()
	if err != nil || len(families) == 0 {
		t.Errorf("Gather = %d families, %v", len(families), err)
	}
}

// scrape fetches the client's MetricsHandler.
func scrape(t *testing.T, client *pgque.Client) string {
	t.Helper()
	rec := httptest.NewRecorder()
	client.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestMetricsSharedRegistry(t *testing.T) {
	t.Parallel()
	env := setup(t)
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := pgque.NewClient(env.pool, &pgque.Config{Registerer: reg}); err != nil {
			t.Fatal(err)
		}
	}
}
