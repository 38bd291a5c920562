package pgqueotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/testing/pgtest"
	"github.com/pgque/pgque/pgqueotel"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSpans sends keyed events through a client with the OTel observer and
// consumes them with a partitioned consumer, then reads the spans from an
// in-memory exporter: one producer span per send, one consumer span per
// handler call with queue, consumer, slot, key and epoch, the failed call
// marked as an error, and a span started in the handler parented to its
// handle span.
func TestSpans(t *testing.T) {
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs := pgqueotel.New(&pgqueotel.Config{TracerProvider: tp, MeterProvider: mp})

	client, err := pgque.Connect(ctx, pgtest.NewInstalledDB(t), &pgque.Config{Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.CreateQueue(ctx, "files"); err != nil {
		t.Fatal(err)
	}
	tk, err := client.NewTicker(&pgque.TickerConfig{LeaseTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer tk.Stop(ctx)

	var mu sync.Mutex
	handled := map[string]int{} // by key
	done := make(chan struct{})
	tracer := tp.Tracer("handler")
	pc, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: "files", Consumer: "indexer", Slots: 2,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			_, child := tracer.Start(ctx, "index file")
			child.End()
			mu.Lock()
			defer mu.Unlock()
			handled[m.PartitionKey]++
			if m.PartitionKey == "acme" && m.RetryCount == 0 {
				return errors.New("index unavailable")
			}
			if handled["acme"] >= 2 && handled["globex"] >= 1 && handled["initech"] >= 1 {
				select {
				case <-done:
				default:
					close(done)
				}
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pc.Stop(ctx)
	_, err = client.SendBatch(ctx, "files", []pgque.Event{
		{Type: "FileCreated", Payload: 1, PartitionKey: "acme"},
		{Type: "FileCreated", Payload: 2, PartitionKey: "globex"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Send(ctx, "files", pgque.Event{Type: "FileDeleted", Payload: 3, PartitionKey: "initech"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("handled %v, want 3 keys and a retry of acme", handled)
	}
	if err := pc.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	spans := exporter.GetSpans()
	var sends, handles, failed int
	handleSpans := map[trace.SpanID]bool{}
	for _, s := range spans {
		attrs := attrMap(s.Attributes)
		switch s.Name {
		case "pgque send files":
			sends++
			if s.SpanKind != trace.SpanKindProducer || attrs["pgque.queue"] != "files" {
				t.Errorf("send span %s: kind %v, attributes %v", s.Name, s.SpanKind, attrs)
			}
		case "pgque handle files":
			handles++
			handleSpans[s.SpanContext.SpanID()] = true
			for _, k := range []string{"pgque.queue", "pgque.consumer", "pgque.slot", "pgque.partition_key", "pgque.epoch", "pgque.event_id"} {
				if attrs[k] == nil {
					t.Errorf("handle span lacks %s: %v", k, attrs)
				}
			}
			if attrs["pgque.consumer"] != "indexer" || attrs["pgque.epoch"].(int64) < 1 {
				t.Errorf("handle span attributes %v", attrs)
			}
			if s.Status.Code == codes.Error {
				failed++
				if attrs["pgque.partition_key"] != "acme" || s.Status.Description != "index unavailable" {
					t.Errorf("failed span %v: %v", attrs, s.Status)
				}
			}
		}
	}
	if sends != 2 || handles < 4 || failed < 1 {
		t.Fatalf("spans: %d sends, %d handles, %d failed; want 2, >= 4, >= 1", sends, handles, failed)
	}
	for _, s := range spans {
		if s.Name == "index file" && !handleSpans[s.Parent.SpanID()] {
			t.Errorf("handler's span is not a child of a handle span: parent %v", s.Parent.SpanID())
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	for _, want := range []string{"pgque.events_sent_total", "pgque.events_processed_total", "pgque.handler_duration_seconds"} {
		if !names[want] {
			t.Errorf("metric %s not recorded; have %v", want, names)
		}
	}
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	out := map[string]any{}
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.AsInterface()
	}
	return out
}
