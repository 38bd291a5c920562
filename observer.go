package pgque

import (
	"context"
	"time"

	"github.com/pgque/pgque/internal/metrics"
)

// Observer receives what the library measures and brackets the calls worth
// tracing, the way pgx's tracers do, so the library itself depends on no
// metrics or tracing package: module github.com/pgque/pgque/pgqueprom turns
// the measurements into Prometheus metrics, github.com/pgque/pgque/pgqueotel
// into OpenTelemetry spans and metrics. Set it in Config.Observer.
//
// Every method is called on the goroutine doing the work, so it must be safe
// for concurrent use and return quickly. Embed NopObserver to implement only
// some of the methods.
type Observer interface {
	// Metric receives each measurement as it is made.
	Metric(m Measurement)
	// SendStart is called before Send, SendTx, SendBatch or SendBatchTx
	// touches the database; the context it returns is used for the send's
	// statements and handed to SendEnd.
	SendStart(ctx context.Context, info SendInfo) context.Context
	// SendEnd is called when the send returned, with its error (nil on
	// success; inside a caller's transaction, success means the events are
	// written, not yet committed).
	SendEnd(ctx context.Context, info SendInfo, err error)
	// HandleStart is called before each handler call; the context it
	// returns is the handler's.
	HandleStart(ctx context.Context, m *Message) context.Context
	// HandleEnd is called when the handler returned or panicked.
	HandleEnd(ctx context.Context, m *Message, result HandleResult)
}

// NopObserver is an Observer that does nothing; embed it in an observer
// that implements only some methods.
type NopObserver struct{}

// Metric does nothing.
func (NopObserver) Metric(Measurement) {}

// SendStart returns ctx.
func (NopObserver) SendStart(ctx context.Context, _ SendInfo) context.Context { return ctx }

// SendEnd does nothing.
func (NopObserver) SendEnd(context.Context, SendInfo, error) {}

// HandleStart returns ctx.
func (NopObserver) HandleStart(ctx context.Context, _ *Message) context.Context { return ctx }

// HandleEnd does nothing.
func (NopObserver) HandleEnd(context.Context, *Message, HandleResult) {}

// MetricKind says how a Measurement's Value is meant.
type MetricKind int

const (
	// MetricCounter: Value is an increment of a running total.
	MetricCounter = MetricKind(metrics.Counter)
	// MetricGauge: Value is the current value.
	MetricGauge = MetricKind(metrics.Gauge)
	// MetricDuration: Value is one observed duration, in seconds.
	MetricDuration = MetricKind(metrics.Duration)
)

// The measurements, by name. The names are those of the Prometheus metrics
// pgqueprom exports, without the "pgque_" prefix.
const (
	// MetricEventsSent (counter, queue): events sent by this process.
	MetricEventsSent = metrics.EventsSent
	// MetricEventsProcessed (counter, queue, consumer): handler returned nil.
	MetricEventsProcessed = metrics.EventsProcessed
	// MetricEventsFailed (counter, queue, consumer): handler failed or
	// panicked.
	MetricEventsFailed = metrics.EventsFailed
	// MetricEventsRetried (counter, queue, consumer): failures scheduled for
	// redelivery.
	MetricEventsRetried = metrics.EventsRetried
	// MetricEventsDeadLettered (counter, queue, consumer): failures moved to
	// the dead letters.
	MetricEventsDeadLettered = metrics.EventsDeadLettered
	// MetricBatchDuration (duration, queue, consumer): receive to ack of one
	// chunk.
	MetricBatchDuration = metrics.BatchDuration
	// MetricHandlerDuration (duration, queue, consumer): one handler call.
	MetricHandlerDuration = metrics.HandlerDuration
	// MetricSlotLag (gauge, queue, consumer, slot): the slot's pending events.
	MetricSlotLag = metrics.SlotLag
	// MetricSlotHeadAge (gauge, queue, consumer, slot): age of the slot's
	// oldest pending event, in seconds.
	MetricSlotHeadAge = metrics.SlotHeadAge
	// MetricSlotTopKeyShare (gauge, queue, consumer, slot): the share (0..1)
	// of the slot's pending events held by its busiest key; above
	// PartitionedConsumerConfig.HotKeyShare the slot is hot.
	MetricSlotTopKeyShare = metrics.SlotTopKeyShare
	// MetricLeaseClaims (counter, queue, consumer): slot leases acquired.
	MetricLeaseClaims = metrics.LeaseClaims
	// MetricLeaseRenewals (counter, queue, consumer): background renewals.
	MetricLeaseRenewals = metrics.LeaseRenewals
	// MetricLeaseTakeovers (counter, queue, consumer): leases taken over
	// from another worker.
	MetricLeaseTakeovers = metrics.LeaseTakeovers
	// MetricLeaseFencings (counter, queue, consumer): slots lost while being
	// worked.
	MetricLeaseFencings = metrics.LeaseFencings
	// MetricLanesRunning (gauge, queue, consumer): handlers running in key
	// lanes in this process.
	MetricLanesRunning = metrics.LanesRunning
	// MetricLaneQueued (gauge, queue, consumer, slot): events of held keys'
	// lanes kept in memory.
	MetricLaneQueued = metrics.LaneQueued
	// MetricLaneOldestAge (gauge, queue, consumer, slot): age of the oldest
	// event a held key's lane still handles, in seconds (0: none).
	MetricLaneOldestAge = metrics.LaneOldestAge
	// MetricKeyHolds (counter, queue, consumer): slow keys held on the
	// server so that their slot could move on.
	MetricKeyHolds = metrics.KeyHolds
	// MetricLaneRedelivered (counter, queue, consumer): events of an
	// earlier owner's key holds put back for redelivery.
	MetricLaneRedelivered = metrics.LaneRedelivered
	// MetricSlotStalled (gauge, queue, consumer, slot): how long the slot
	// has been stalled, in seconds: behind, with no progress for longer
	// than twice the lease TTL (view partition_slot_stalls); 0 when it is
	// not. Any value above 0 means no live worker consumes the slot and it
	// pins rotation for the whole queue: see docs/operations.md.
	MetricSlotStalled = metrics.SlotStalled
	// MetricSlotGivenUp (counter, queue, consumer): slots this process's
	// watchdog gave up because their poll loop was stuck.
	MetricSlotGivenUp = metrics.SlotGivenUp
	// MetricTickerRounds (counter): ticker() rounds made while leading.
	MetricTickerRounds = metrics.TickerRounds
	// MetricTickerLeader (gauge): 1 while this process's ticker leads.
	MetricTickerLeader = metrics.TickerLeader
)

// Measurement is one value the library measured.
type Measurement struct {
	// Name is one of the Metric... constants.
	Name  string
	Kind  MetricKind
	Value float64
	// Queue, Consumer and Slot (a decimal slot number) are the
	// measurement's dimensions; those it does not have are "".
	Queue, Consumer, Slot string
}

// SendInfo describes one send.
type SendInfo struct {
	Queue string
	// Events is how many events the call sends.
	Events int
	// Key is the event's partition key for a single-event send (the NULL
	// key for batches).
	Key KeyRef
	// InTx reports a send inside the caller's transaction (SendTx,
	// SendBatchTx).
	InTx bool
}

// HandleResult is how one handler call ended.
type HandleResult struct {
	// Err is what the handler returned; a panic is an error wrapping
	// ErrHandlerPanic.
	Err      error
	Duration time.Duration
}

// observerSink forwards the internal measurements to an Observer.
type observerSink struct{ o Observer }

func (s observerSink) Record(name string, kind metrics.Kind, value float64, l metrics.Labels) {
	s.o.Metric(Measurement{Name: name, Kind: MetricKind(kind), Value: value, Queue: l.Queue, Consumer: l.Consumer, Slot: l.Slot})
}

// observeSend brackets one send with the observer's hooks; call the
// returned function with the send's error.
func (c *Client) observeSend(ctx context.Context, info SendInfo) (context.Context, func(error)) {
	o := c.config.Observer
	ctx = o.SendStart(ctx, info)
	return ctx, func(err error) { o.SendEnd(ctx, info, err) }
}

// keyRef is the event's key as the database stores it: Go sends "" as the
// NULL key.
func (e Event) keyRef() KeyRef {
	if e.PartitionKey == "" {
		return NullKey
	}
	return KeyOf(e.PartitionKey)
}
