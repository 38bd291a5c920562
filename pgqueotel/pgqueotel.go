// Package pgqueotel records pgque's work as OpenTelemetry spans and,
// optionally, metrics.
//
// It is a module of its own, so that the pgque library does not depend on
// OpenTelemetry. Set the observer in pgque.Config:
//
//	obs := pgqueotel.New(&pgqueotel.Config{TracerProvider: tp, MeterProvider: mp})
//	client, err := pgque.Connect(ctx, dsn, &pgque.Config{Observer: obs})
//
// Every send gets a producer span "pgque send <queue>", every handler call a
// consumer span "pgque handle <queue>" with the queue, consumer, slot,
// partition key, epoch, event id and retry count as attributes; a failed
// call records its error. The handler's context carries its span, so spans
// the handler starts are its children. With a MeterProvider every pgque
// measurement becomes an instrument named "pgque.<measurement>".
package pgqueotel

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgque/pgque"
)

// instrumentationName names the tracer and meter.
const instrumentationName = "github.com/pgque/pgque/pgqueotel"

// Attribute keys.
const (
	AttrQueue      = attribute.Key("pgque.queue")
	AttrConsumer   = attribute.Key("pgque.consumer")
	AttrSlot       = attribute.Key("pgque.slot")
	AttrKey        = attribute.Key("pgque.partition_key")
	AttrEpoch      = attribute.Key("pgque.epoch")
	AttrEventID    = attribute.Key("pgque.event_id")
	AttrRetryCount = attribute.Key("pgque.retry_count")
	AttrEvents     = attribute.Key("pgque.events")
	AttrInTx       = attribute.Key("pgque.in_tx")
)

// Config configures an Observer. The zero value traces through the global
// TracerProvider and records no metrics.
type Config struct {
	// TracerProvider makes the tracer; nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider, when set, receives pgque's measurements as metrics.
	MeterProvider metric.MeterProvider
}

// Observer is a pgque.Observer that records OpenTelemetry spans and metrics.
type Observer struct {
	tracer trace.Tracer
	meter  metric.Meter // nil: no metrics

	mu          sync.Mutex
	instruments map[string]any
}

// New returns an Observer; a nil config is the zero Config.
func New(config *Config) *Observer {
	var cfg Config
	if config != nil {
		cfg = *config
	}
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	o := &Observer{tracer: tp.Tracer(instrumentationName), instruments: map[string]any{}}
	if cfg.MeterProvider != nil {
		o.meter = cfg.MeterProvider.Meter(instrumentationName)
	}
	return o
}

// SendStart starts the send's producer span.
func (o *Observer) SendStart(ctx context.Context, info pgque.SendInfo) context.Context {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "pgque"), AttrQueue.String(info.Queue),
		AttrEvents.Int(info.Events), AttrInTx.Bool(info.InTx),
	}
	if k, ok := info.Key.Value(); ok {
		attrs = append(attrs, AttrKey.String(k))
	}
	ctx, _ = o.tracer.Start(ctx, "pgque send "+info.Queue, trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	return ctx
}

// SendEnd ends the send's span, recording err.
func (o *Observer) SendEnd(ctx context.Context, _ pgque.SendInfo, err error) {
	end(trace.SpanFromContext(ctx), err)
}

// HandleStart starts the handler call's consumer span.
func (o *Observer) HandleStart(ctx context.Context, m *pgque.Message) context.Context {
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "pgque"), AttrQueue.String(m.Queue), AttrConsumer.String(m.Consumer),
		AttrEventID.Int64(m.ID), AttrRetryCount.Int(m.RetryCount),
	}
	if m.Epoch != 0 { // partitioned consumers only
		attrs = append(attrs, AttrSlot.Int(m.Slot), AttrEpoch.Int64(m.Epoch))
	}
	if k, ok := m.Key().Value(); ok {
		attrs = append(attrs, AttrKey.String(k))
	}
	ctx, _ = o.tracer.Start(ctx, "pgque handle "+m.Queue, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	return ctx
}

// HandleEnd ends the handler call's span, recording its error.
func (o *Observer) HandleEnd(ctx context.Context, _ *pgque.Message, r pgque.HandleResult) {
	end(trace.SpanFromContext(ctx), r.Err)
}

// end records err, if any, and ends span.
func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Metric records m on the instrument of its name, made on first use.
func (o *Observer) Metric(m pgque.Measurement) {
	if o.meter == nil {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	if m.Queue != "" {
		attrs = append(attrs, AttrQueue.String(m.Queue))
	}
	if m.Consumer != "" {
		attrs = append(attrs, AttrConsumer.String(m.Consumer))
	}
	if m.Slot != "" {
		attrs = append(attrs, AttrSlot.String(m.Slot))
	}
	opt := metric.WithAttributes(attrs...)
	ctx := context.Background()
	switch inst := o.instrument(m).(type) {
	case metric.Float64Counter:
		inst.Add(ctx, m.Value, opt)
	case metric.Float64Gauge:
		inst.Record(ctx, m.Value, opt)
	case metric.Float64Histogram:
		inst.Record(ctx, m.Value, opt)
	}
}

// instrument returns the instrument for m's name and kind (nil if it could
// not be made).
func (o *Observer) instrument(m pgque.Measurement) any {
	o.mu.Lock()
	defer o.mu.Unlock()
	if inst, ok := o.instruments[m.Name]; ok {
		return inst
	}
	name := "pgque." + m.Name
	var inst any
	var err error
	switch m.Kind {
	case pgque.MetricCounter:
		inst, err = o.meter.Float64Counter(name)
	case pgque.MetricGauge:
		inst, err = o.meter.Float64Gauge(name)
	case pgque.MetricDuration:
		inst, err = o.meter.Float64Histogram(name, metric.WithUnit("s"))
	}
	if err != nil {
		inst = nil
	}
	o.instruments[m.Name] = inst
	return inst
}

var _ pgque.Observer = (*Observer)(nil)
