// Package metrics is what the library measures, by name. Instrumented code
// records through Metrics (the same calls whatever consumes them); every
// measurement goes to one Sink, which the Client connects to its Observer.
// The names are the Prometheus metric names without the "pgque_" namespace,
// so an adapter that keeps them keeps existing dashboards working.
package metrics

// Kind says how a measurement is meant.
type Kind int

const (
	// Counter: Value is an increment.
	Counter Kind = iota + 1
	// Gauge: Value is the current value.
	Gauge
	// Duration: Value is one observation, in seconds.
	Duration
)

// Names of the measurements.
const (
	EventsSent         = "events_sent_total"
	EventsProcessed    = "events_processed_total"
	EventsFailed       = "events_failed_total"
	EventsRetried      = "events_retried_total"
	EventsDeadLettered = "events_dead_lettered_total"
	BatchDuration      = "batch_duration_seconds"
	HandlerDuration    = "handler_duration_seconds"
	SlotLag            = "slot_lag_events"
	SlotHeadAge        = "slot_head_age_seconds"
	SlotTopKeyShare    = "slot_top_key_share"
	LeaseClaims        = "lease_claims_total"
	LeaseRenewals      = "lease_renewals_total"
	LeaseTakeovers     = "lease_takeovers_total"
	LeaseFencings      = "lease_fencings_total"
	TickerRounds       = "ticker_rounds_total"
	TickerLeader       = "ticker_leader"
	LanesRunning       = "lanes_running_handlers"
	LaneQueued         = "lane_queued_events"
	LaneOldestAge      = "lane_oldest_inflight_age_seconds"
	KeyHolds           = "key_holds_total"
	LaneRedelivered    = "lane_redelivered_events_total"
	SlotStalled        = "slot_stalled_seconds"
	SlotGivenUp        = "slot_watchdog_releases_total"
)

// Labels are the dimensions of a measurement; unused ones are "".
type Labels struct {
	Queue, Consumer, Slot string
}

// Sink receives every measurement. It must be safe for concurrent use and
// return quickly.
type Sink interface {
	Record(name string, kind Kind, value float64, labels Labels)
}

// Metrics holds one handle per measurement of one Client.
type Metrics struct {
	// Sent counts events committed by Send, SendTx, SendBatch (by queue).
	Sent Vec
	// Processed counts events whose handler returned nil.
	Processed Vec
	// Failed counts events whose handler returned an error or panicked.
	Failed Vec
	// Retried counts failed events scheduled for redelivery.
	Retried Vec
	// DeadLettered counts failed events moved to the dead-letter table.
	DeadLettered Vec
	// BatchDuration observes receive→ack of one chunk.
	BatchDuration Vec
	// HandlerDuration observes one handler call.
	HandlerDuration Vec
	// SlotLag is the number of each slot's events committed after its cursor.
	SlotLag Vec
	// SlotHeadAge is the age of each slot's oldest pending event, in seconds.
	SlotHeadAge Vec
	// SlotTopKeyShare is the share (0..1) of each slot's pending events
	// held by its busiest key.
	SlotTopKeyShare Vec
	// LeaseClaims counts slot leases acquired (new epochs) by this process.
	LeaseClaims Vec
	// LeaseRenewals counts explicit background renewals.
	LeaseRenewals Vec
	// LeaseTakeovers counts claims of a slot whose lease another worker had
	// held (released or expired).
	LeaseTakeovers Vec
	// LeaseFencings counts slots this process lost while working them.
	LeaseFencings Vec
	// LanesRunning is the number of handlers running in key lanes.
	LanesRunning Vec
	// LaneQueued is, per slot, the events held in memory by lanes whose
	// keys are held on the server.
	LaneQueued Vec
	// LaneOldestAge is, per slot, the age of the oldest event still being
	// handled by a held lane, in seconds.
	LaneOldestAge Vec
	// KeyHolds counts keys held so that their slot could move on.
	KeyHolds Vec
	// LaneRedelivered counts events of holds left by an earlier owner of a
	// slot (a crash or takeover) put back for redelivery.
	LaneRedelivered Vec
	// SlotStalled is, per slot, how long it has been stalled (behind with
	// no progress past its stall bound; partition_slot_stalls), in seconds;
	// 0 when it is not.
	SlotStalled Vec
	// SlotGivenUp counts slots this process's watchdog gave up because
	// their poll loop made no progress.
	SlotGivenUp Vec
	// Ticks counts successful ticker() rounds by the leading ticker.
	Ticks Point
	// TickerLeader is 1 while this process's ticker holds the lease.
	TickerLeader Point
}

// New returns the handles, recording into sink (nil: nowhere).
func New(sink Sink) *Metrics {
	if sink == nil {
		sink = discard{}
	}
	v := func(name string, kind Kind) Vec { return Vec{sink: sink, name: name, kind: kind} }
	return &Metrics{
		Sent: v(EventsSent, Counter), Processed: v(EventsProcessed, Counter), Failed: v(EventsFailed, Counter),
		Retried: v(EventsRetried, Counter), DeadLettered: v(EventsDeadLettered, Counter),
		BatchDuration: v(BatchDuration, Duration), HandlerDuration: v(HandlerDuration, Duration),
		SlotLag: v(SlotLag, Gauge), SlotHeadAge: v(SlotHeadAge, Gauge),
		SlotTopKeyShare: v(SlotTopKeyShare, Gauge),
		LeaseClaims:     v(LeaseClaims, Counter), LeaseRenewals: v(LeaseRenewals, Counter),
		LeaseTakeovers: v(LeaseTakeovers, Counter), LeaseFencings: v(LeaseFencings, Counter),
		LanesRunning: v(LanesRunning, Gauge), LaneQueued: v(LaneQueued, Gauge),
		LaneOldestAge: v(LaneOldestAge, Gauge), KeyHolds: v(KeyHolds, Counter),
		LaneRedelivered: v(LaneRedelivered, Counter),
		SlotStalled:     v(SlotStalled, Gauge), SlotGivenUp: v(SlotGivenUp, Counter),
		Ticks:        Point{sink: sink, name: TickerRounds, kind: Counter},
		TickerLeader: Point{sink: sink, name: TickerLeader, kind: Gauge},
	}
}

// Vec is one measurement, to be given its labels.
type Vec struct {
	sink Sink
	name string
	kind Kind
}

// WithLabelValues returns the measurement for queue [, consumer [, slot]].
func (v Vec) WithLabelValues(values ...string) Point {
	p := Point{sink: v.sink, name: v.name, kind: v.kind}
	for i, s := range values {
		switch i {
		case 0:
			p.labels.Queue = s
		case 1:
			p.labels.Consumer = s
		case 2:
			p.labels.Slot = s
		}
	}
	return p
}

// Point is one measurement with its labels.
type Point struct {
	sink   Sink
	name   string
	kind   Kind
	labels Labels
}

// Inc adds one to a counter.
func (p Point) Inc() { p.sink.Record(p.name, p.kind, 1, p.labels) }

// Add adds n to a counter (zero too: it makes the series exist).
func (p Point) Add(n float64) { p.sink.Record(p.name, p.kind, n, p.labels) }

// Set sets a gauge.
func (p Point) Set(v float64) { p.sink.Record(p.name, p.kind, v, p.labels) }

// Observe records one duration, in seconds.
func (p Point) Observe(seconds float64) { p.sink.Record(p.name, p.kind, seconds, p.labels) }

type discard struct{}

func (discard) Record(string, Kind, float64, Labels) {}
