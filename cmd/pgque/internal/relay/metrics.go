package relay

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the relay's Prometheus collectors, beside the consumer's own
// (pgque_events_processed_total and the others).
type Metrics struct {
	// Requests counts finished requests by outcome: 2xx, 3xx, 4xx, 5xx,
	// timeout or error (no response).
	Requests *prometheus.CounterVec
	// Duration observes each request, whatever its outcome.
	Duration prometheus.Histogram
	// InFlight is the number of requests in flight.
	InFlight prometheus.Gauge
	// Retries counts events handed back for redelivery, by reason
	// (status, timeout, connection, request: a request the event made
	// impossible to build).
	Retries *prometheus.CounterVec
	// DeadLetters counts events the endpoint rejected for good.
	DeadLetters prometheus.Counter
	// Unreachable counts failed attempts at an endpoint that could not be
	// reached or is misconfigured; each is repeated after a backoff.
	Unreachable *prometheus.CounterVec
	// EndpointUp is 0 while some request waits for an unreachable endpoint,
	// 1 otherwise.
	EndpointUp prometheus.Gauge
}

// NewMetrics creates the collectors and registers them on reg (nil: not
// registered). Collectors reg already holds are shared.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "requests_total",
			Help: "Relay requests by outcome: 2xx, 3xx, 4xx, 5xx, timeout, error.",
		}, []string{"class"})),
		Duration: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "request_duration_seconds",
			Help: "Time of one relay request, from sending to the end of the response.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		})),
		InFlight: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "in_flight_requests", Help: "Relay requests in flight.",
		})),
		Retries: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "retries_total",
			Help: "Events handed back for redelivery, by reason: status, timeout, connection, request.",
		}, []string{"reason"})),
		DeadLetters: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "dead_letters_total", Help: "Events the endpoint rejected for good (dead-lettered).",
		})),
		Unreachable: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "unreachable_attempts_total",
			Help: "Attempts at an unreachable or misconfigured endpoint (repeated after a backoff), by reason.",
		}, []string{"reason"})),
		EndpointUp: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "pgque", Subsystem: "relay", Name: "endpoint_up", Help: "0 while a request waits for an unreachable endpoint, else 1.",
		})),
	}
	m.EndpointUp.Set(1)
	return m
}

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
		panic(err)
	}
	return c
}
