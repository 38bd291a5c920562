// Package pgqueprom exports pgque's measurements as Prometheus metrics.
//
// It is a module of its own, so that the pgque library does not depend on
// the Prometheus client: a service that wants the metrics adds this module
// and sets the observer in pgque.Config:
//
//	reg := prometheus.NewRegistry()
//	obs, err := pgqueprom.New(reg)
//	...
//	client, err := pgque.Connect(ctx, dsn, &pgque.Config{Observer: obs})
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The metric names are pgque's measurement names with the "pgque_"
// namespace (pgque_events_sent_total, pgque_slot_lag_events, ...), the
// labels are queue, consumer and slot where the measurement has them.
package pgqueprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgque/pgque"
)

// Namespace prefixes every metric name.
const Namespace = "pgque"

// Label names.
const (
	labelQueue    = "queue"
	labelConsumer = "consumer"
	labelSlot     = "slot"
)

// latencyBuckets are the histogram buckets of the duration metrics, in
// seconds: 0.5 ms to 16 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// metric describes one Prometheus metric.
type metric struct {
	help   string
	labels []string
}

var (
	q   = []string{labelQueue}
	qc  = []string{labelQueue, labelConsumer}
	qcs = []string{labelQueue, labelConsumer, labelSlot}
)

// metrics lists every measurement pgque makes, by name.
var metrics = map[string]metric{
	pgque.MetricEventsSent:         {"Events committed by this process's producers.", q},
	pgque.MetricEventsProcessed:    {"Events whose handler succeeded.", qc},
	pgque.MetricEventsFailed:       {"Events whose handler returned an error or panicked.", qc},
	pgque.MetricEventsRetried:      {"Failed events scheduled for redelivery.", qc},
	pgque.MetricEventsDeadLettered: {"Failed events moved to the dead-letter table.", qc},
	pgque.MetricBatchDuration:      {"Time from receive to ack of one chunk.", qc},
	pgque.MetricHandlerDuration:    {"Time spent in one handler call.", qc},
	pgque.MetricSlotLag:            {"Events of each slot committed after its cursor (pending).", qcs},
	pgque.MetricSlotHeadAge:        {"Age of each slot's oldest pending event.", qcs},
	pgque.MetricSlotTopKeyShare:    {"Share of each slot's pending events held by its busiest key.", qcs},
	pgque.MetricLeaseClaims:        {"Slot leases acquired by this process.", qc},
	pgque.MetricLeaseRenewals:      {"Background slot lease renewals.", qc},
	pgque.MetricLeaseTakeovers:     {"Slot leases taken over from another worker.", qc},
	pgque.MetricLeaseFencings:      {"Slots lost while being worked (fenced).", qc},
	pgque.MetricLanesRunning:       {"Handlers running in key lanes.", qc},
	pgque.MetricLaneQueued:         {"Events of held keys' lanes kept in memory, per slot.", qcs},
	pgque.MetricLaneOldestAge:      {"Age of the oldest event a held key's lane still handles, per slot.", qcs},
	pgque.MetricKeyHolds:           {"Slow keys held so that their slot could move on.", qc},
	pgque.MetricLaneRedelivered:    {"Events of an earlier owner's key holds put back for redelivery.", qc},
	pgque.MetricSlotStalled:        {"Seconds each slot has been behind without progress past its stall bound (0: not stalled).", qcs},
	pgque.MetricSlotGivenUp:        {"Slots given up by this process's watchdog because their poll loop was stuck.", qc},
	pgque.MetricTickerRounds:       {"ticker() calls made while leading.", nil},
	pgque.MetricTickerLeader:       {"1 while this process's ticker holds the ticker lease.", nil},
}

// kinds says which Prometheus type each measurement is.
var kinds = map[string]pgque.MetricKind{
	pgque.MetricEventsSent: pgque.MetricCounter, pgque.MetricEventsProcessed: pgque.MetricCounter,
	pgque.MetricEventsFailed: pgque.MetricCounter, pgque.MetricEventsRetried: pgque.MetricCounter,
	pgque.MetricEventsDeadLettered: pgque.MetricCounter, pgque.MetricBatchDuration: pgque.MetricDuration,
	pgque.MetricHandlerDuration: pgque.MetricDuration, pgque.MetricSlotLag: pgque.MetricGauge,
	pgque.MetricSlotHeadAge: pgque.MetricGauge, pgque.MetricSlotTopKeyShare: pgque.MetricGauge,
	pgque.MetricLeaseClaims:   pgque.MetricCounter,
	pgque.MetricLeaseRenewals: pgque.MetricCounter, pgque.MetricLeaseTakeovers: pgque.MetricCounter,
	pgque.MetricLeaseFencings: pgque.MetricCounter, pgque.MetricTickerRounds: pgque.MetricCounter,
	pgque.MetricTickerLeader: pgque.MetricGauge,
	pgque.MetricLanesRunning: pgque.MetricGauge, pgque.MetricLaneQueued: pgque.MetricGauge,
	pgque.MetricLaneOldestAge: pgque.MetricGauge, pgque.MetricKeyHolds: pgque.MetricCounter,
	pgque.MetricLaneRedelivered: pgque.MetricCounter,
	pgque.MetricSlotStalled:     pgque.MetricGauge, pgque.MetricSlotGivenUp: pgque.MetricCounter,
}

// Observer is a pgque.Observer that records every measurement in
// Prometheus collectors. It does not trace: SendStart and HandleStart return
// their context unchanged.
type Observer struct {
	pgque.NopObserver
	counters   map[string]*prometheus.CounterVec
	gauges     map[string]*prometheus.GaugeVec
	histograms map[string]*prometheus.HistogramVec
}

// New creates the collectors and registers them on reg. Collectors reg
// already holds from another Observer (several Clients in one process) are
// shared. Any other registration failure, such as a metric of the same name
// and another type or labels, is returned.
func New(reg prometheus.Registerer) (*Observer, error) {
	if reg == nil {
		return nil, errors.New("pgqueprom: nil Registerer")
	}
	o := &Observer{
		counters:   map[string]*prometheus.CounterVec{},
		gauges:     map[string]*prometheus.GaugeVec{},
		histograms: map[string]*prometheus.HistogramVec{},
	}
	for name, m := range metrics {
		var err error
		switch kinds[name] {
		case pgque.MetricCounter:
			o.counters[name], err = register(reg, prometheus.NewCounterVec(
				prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: m.help}, m.labels))
		case pgque.MetricGauge:
			o.gauges[name], err = register(reg, prometheus.NewGaugeVec(
				prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: m.help}, m.labels))
		case pgque.MetricDuration:
			o.histograms[name], err = register(reg, prometheus.NewHistogramVec(
				prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: m.help, Buckets: latencyBuckets}, m.labels))
		}
		if err != nil {
			return nil, fmt.Errorf("pgqueprom: registering %s_%s: %w", Namespace, name, err)
		}
	}
	return o, nil
}

// register adds c to reg, or returns the equal collector reg already has.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// Metric records m; a measurement pgqueprom does not know (from a newer
// library) is ignored.
func (o *Observer) Metric(m pgque.Measurement) {
	desc, ok := metrics[m.Name]
	if !ok {
		return
	}
	values := labelValues(desc.labels, m)
	switch {
	case o.counters[m.Name] != nil:
		o.counters[m.Name].WithLabelValues(values...).Add(m.Value)
	case o.gauges[m.Name] != nil:
		o.gauges[m.Name].WithLabelValues(values...).Set(m.Value)
	case o.histograms[m.Name] != nil:
		o.histograms[m.Name].WithLabelValues(values...).Observe(m.Value)
	}
}

// labelValues picks m's values for labels, in order.
func labelValues(labels []string, m pgque.Measurement) []string {
	out := make([]string, len(labels))
	for i, l := range labels {
		switch l {
		case labelQueue:
			out[i] = m.Queue
		case labelConsumer:
			out[i] = m.Consumer
		case labelSlot:
			out[i] = m.Slot
		}
	}
	return out
}

var _ pgque.Observer = (*Observer)(nil)
