// Package metrics defines pgque's Prometheus collectors. They always exist,
// so instrumented code never checks for nil; they are registered only when
// the caller provides a prometheus.Registerer.
package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "pgque"

// Label names.
const (
	labelQueue    = "queue"
	labelConsumer = "consumer"
	labelSlot     = "slot"
)

// Metrics holds every collector of one Client.
type Metrics struct {
	// Sent counts events committed by Send, SendTx, SendBatch (by queue).
	Sent *prometheus.CounterVec
	// Processed counts events whose handler returned nil.
	Processed *prometheus.CounterVec
	// Failed counts events whose handler returned an error or panicked.
	Failed *prometheus.CounterVec
	// Retried counts failed events scheduled for redelivery.
	Retried *prometheus.CounterVec
	// DeadLettered counts failed events moved to the dead-letter table.
	DeadLettered *prometheus.CounterVec
	// BatchDuration observes receive→ack of one chunk.
	BatchDuration *prometheus.HistogramVec
	// HandlerDuration observes one handler call.
	HandlerDuration *prometheus.HistogramVec
	// SlotLag is the number of each slot's events committed after its cursor.
	SlotLag *prometheus.GaugeVec
	// SlotHeadAge is the age of each slot's oldest pending event, in seconds.
	SlotHeadAge *prometheus.GaugeVec
	// LeaseClaims counts slot leases acquired (new epochs) by this process.
	LeaseClaims *prometheus.CounterVec
	// LeaseRenewals counts explicit background renewals.
	LeaseRenewals *prometheus.CounterVec
	// LeaseTakeovers counts claims of a slot whose lease another worker had
	// held (released or expired).
	LeaseTakeovers *prometheus.CounterVec
	// LeaseFencings counts slots this process lost while working them.
	LeaseFencings *prometheus.CounterVec
	// LanesRunning is the number of handlers running in key lanes.
	LanesRunning *prometheus.GaugeVec
	// LaneQueued is, per slot, the events held in memory by lanes whose
	// keys are held on the server.
	LaneQueued *prometheus.GaugeVec
	// LaneOldestAge is, per slot, the age of the oldest event still being
	// handled by a held lane, in seconds.
	LaneOldestAge *prometheus.GaugeVec
	// KeyHolds counts keys held so that their slot could move on.
	KeyHolds *prometheus.CounterVec
	// LaneRedelivered counts events of holds left by an earlier owner of a
	// slot (a crash or takeover) put back for redelivery.
	LaneRedelivered *prometheus.CounterVec
	// Ticks counts successful ticker() rounds by the leading ticker.
	Ticks prometheus.Counter
	// TickerLeader is 1 while this process's ticker holds the lease.
	TickerLeader prometheus.Gauge
}

// New creates the collectors and registers them on reg (nil: not
// registered). Collectors that reg already holds — another Client in the same
// process — are shared rather than rejected.
func New(reg prometheus.Registerer) *Metrics {
	qc := []string{labelQueue, labelConsumer}
	qcs := []string{labelQueue, labelConsumer, labelSlot}
	latency := prometheus.ExponentialBuckets(0.0005, 2, 16) // 0.5 ms … 16 s
	m := &Metrics{
		Sent:            counter(reg, "events_sent_total", "Events committed by this process's producers.", labelQueue),
		Processed:       counter(reg, "events_processed_total", "Events whose handler succeeded.", qc...),
		Failed:          counter(reg, "events_failed_total", "Events whose handler returned an error or panicked.", qc...),
		Retried:         counter(reg, "events_retried_total", "Failed events scheduled for redelivery.", qc...),
		DeadLettered:    counter(reg, "events_dead_lettered_total", "Failed events moved to the dead-letter table.", qc...),
		BatchDuration:   histogram(reg, "batch_duration_seconds", "Time from receive to ack of one chunk.", latency, qc...),
		HandlerDuration: histogram(reg, "handler_duration_seconds", "Time spent in one handler call.", latency, qc...),
		SlotLag:         gauge(reg, "slot_lag_events", "Events of each slot committed after its cursor (pending).", qcs...),
		SlotHeadAge:     gauge(reg, "slot_head_age_seconds", "Age of each slot's oldest pending event.", qcs...),
		LeaseClaims:     counter(reg, "lease_claims_total", "Slot leases acquired by this process.", qc...),
		LeaseRenewals:   counter(reg, "lease_renewals_total", "Background slot lease renewals.", qc...),
		LeaseTakeovers:  counter(reg, "lease_takeovers_total", "Slot leases taken over from another worker.", qc...),
		LeaseFencings:   counter(reg, "lease_fencings_total", "Slots lost while being worked (fenced).", qc...),
		LanesRunning:    gauge(reg, "lanes_running_handlers", "Handlers running in key lanes.", qc...),
		LaneQueued:      gauge(reg, "lane_queued_events", "Events of held keys' lanes kept in memory, per slot.", qcs...),
		LaneOldestAge:   gauge(reg, "lane_oldest_inflight_age_seconds", "Age of the oldest event a held key's lane still handles, per slot.", qcs...),
		KeyHolds:        counter(reg, "key_holds_total", "Slow keys held so that their slot could move on.", qc...),
		LaneRedelivered: counter(reg, "lane_redelivered_events_total", "Events of an earlier owner's key holds put back for redelivery.", qc...),
	}
	m.Ticks = register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "ticker_rounds_total", Help: "ticker() calls made while leading.",
	}))
	m.TickerLeader = register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "ticker_leader", Help: "1 while this process's ticker holds the ticker lease.",
	}))
	return m
}

func counter(reg prometheus.Registerer, name, help string, labels ...string) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, labels))
}

func gauge(reg prometheus.Registerer, name, help string, labels ...string) *prometheus.GaugeVec {
	return register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, labels))
}

func histogram(reg prometheus.Registerer, name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: name, Help: help, Buckets: buckets,
	}, labels))
}

// register adds c to reg, or returns the equal collector reg already has.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		// A conflicting collector of another type: keep ours unregistered
		// rather than fail the client over observability.
	}
	return c
}
