package pgque

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/pgque/pgque/internal/lanes"
)

// Defaults for PartitionedConsumerConfig.
const (
	// LeaseTTLDefault is how long a slot lease lives without renewal. A
	// crashed worker's slots are taken over about this long after the
	// crash.
	LeaseTTLDefault = 30 * time.Second
	// LeaseTTLMin is the shortest accepted LeaseTTL: leases are renewed
	// every third of it.
	LeaseTTLMin = time.Second
	// ClaimIntervalDefault is the period of the claim loop (jittered ±20%):
	// how quickly a free slot is found and the spread rebalanced.
	ClaimIntervalDefault = time.Second
	// ClaimIntervalMin is the shortest accepted ClaimInterval (the
	// TypeScript worker's too): a worker's presence lasts three, which
	// announce_worker needs to be at least a millisecond.
	ClaimIntervalMin = 10 * time.Millisecond
	// ClaimIntervalMax is the longest accepted ClaimInterval: a worker's
	// presence lasts three claim intervals, and announce_worker keeps one
	// for at most 10 minutes (a longer one failed every announcement).
	ClaimIntervalMax = 200 * time.Second
	// SlotStatusIntervalDefault is how often the per-slot lag and head-age
	// gauges are refreshed from partition_slot_status when metrics are
	// registered. Reading the view counts every slot's pending events, so
	// its cost grows with N × backlog.
	SlotStatusIntervalDefault = 15 * time.Second
	// MaxWorkersDefault is how many handlers a PartitionedConsumer runs at
	// once across all the slots it owns, when MaxWorkers is zero. Handlers
	// are mostly waiting on I/O (5-50 ms calls to storage, HTTP, another
	// database), so the limit is sized for that: with 20 ms handlers and
	// 200 active keys, 256 places let one process run about 8 500 events/s
	// (docs/benchmarks.md). A handler that needs a scarce resource per call
	// (a connection of a small pool) should bound it itself or set
	// MaxWorkers lower.
	MaxWorkersDefault = 256
	// HoldAfterDefault is PartitionedConsumerConfig.HoldAfter's default.
	HoldAfterDefault = lanes.HoldAfter
	// MaxEventsPerSlotFactor sets the default MaxEventsPerSlot: this many
	// chunks (BatchSize events each) per slot.
	MaxEventsPerSlotFactor = 10
)

// FailurePolicy says what happens to a key's later events after a handler
// fails on one of them. It is persisted per (queue, consumer) in the
// database, with the consumer's first slot, and shared by every process of
// the pool; Client.SetFailurePolicy changes it.
type FailurePolicy int

const (
	// FailurePolicySkip (the default): the failed event is nacked and
	// redelivered after its retry delay; later events of the same key go on
	// and may overtake it (at-least-once, G3 skip).
	FailurePolicySkip FailurePolicy = iota + 1
	// FailurePolicyPause: the failed event's key is blocked on its slot. No
	// later event of the key is handled until the failed one succeeds on a
	// retry or is dead-lettered (past the queue's max_retries, or by
	// Client.UnblockKey); then the held events are delivered in ev_id order,
	// each exactly once, and waiting never counts as a retry (G3 pause).
	// Other keys keep flowing meanwhile. Client.BlockedKeys lists the blocked
	// keys.
	FailurePolicyPause
)

// FailurePolicyDefault is the policy a consumer gets when its first slot is
// subscribed by a PartitionedConsumerConfig that leaves FailurePolicy zero.
const FailurePolicyDefault = FailurePolicySkip

// String names the policy as the SQL does.
func (p FailurePolicy) String() string {
	switch p {
	case FailurePolicySkip:
		return "skip"
	case FailurePolicyPause:
		return "pause"
	default:
		return fmt.Sprintf("FailurePolicy(%d)", int(p))
	}
}

// valid reports whether p is a known policy.
func (p FailurePolicy) valid() bool {
	return p == FailurePolicySkip || p == FailurePolicyPause
}

// ParseFailurePolicy reads a policy by the name String gives it ("skip" or
// "pause"); anything else is an ErrInvalidArgument.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	p, err := parseFailurePolicy(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return p, nil
}

// parseFailurePolicy reads a policy as the SQL names it.
func parseFailurePolicy(s string) (FailurePolicy, error) {
	switch s {
	case "skip":
		return FailurePolicySkip, nil
	case "pause":
		return FailurePolicyPause, nil
	default:
		return 0, fmt.Errorf("unknown failure policy %q", s)
	}
}

// PartitionedConsumerConfig configures a PartitionedConsumer.
type PartitionedConsumerConfig struct {
	// Queue is the queue to consume. Required.
	Queue string
	// Consumer is the consumer name shared by every process of the pool.
	// Required.
	Consumer string
	// Slots is N, the number of slots; it is persisted per (queue, consumer)
	// and every process must use the same value. Required.
	Slots int
	// MaxActiveSlots caps the slots this process claims, and so works at
	// once. Default Slots. When the sum over live processes is below Slots,
	// some slots go unpolled and pin the queue's rotation.
	MaxActiveSlots int
	// WorkerID identifies this process in slot leases; it must be unique
	// among live processes, valid UTF-8 without NUL, and at most
	// WorkerIDMaxBytes. Default hostname-pid-random.
	WorkerID string
	// LeaseTTL is the slot lease lifetime. Default LeaseTTLDefault, minimum
	// LeaseTTLMin.
	LeaseTTL time.Duration
	// ClaimInterval is the claim loop's period. Default
	// ClaimIntervalDefault, at most ClaimIntervalMax.
	ClaimInterval time.Duration
	// PollInterval is how often an idle slot looks for work without a
	// notification. Default PollIntervalDefault.
	PollInterval time.Duration
	// SlotStatusInterval is how often the per-slot gauges are refreshed.
	// Default SlotStatusIntervalDefault when Config.Observer is set, never
	// otherwise; negative disables.
	SlotStatusInterval time.Duration
	// HotKeyShare: with the slot status refresh on, when one key holds more
	// than this share (0..1) of a slot's pending events, a warning is
	// logged and the pgque_slot_top_key_share gauge shows it: that slot
	// goes no faster than one key's handler. Default HotKeyShareDefault;
	// negative disables the check.
	HotKeyShare float64
	// GatherReceives, when set, makes the receives of the slots one tick
	// wakes one call (receive_partitioned_raw_slots) instead of one call
	// each: less server CPU per event, more latency, since the call serves
	// its slots one after another. At 500 keyed events/s over 16 slots it
	// took the server's CPU per event from 1 139–1 285 µs to 738–1 120 and
	// p50 latency from 8.3–8.7 ms to 9.4–11.2 ms (docs/benchmarks.md, "One
	// call for the slots a tick wakes"). Default false.
	GatherReceives bool
	// BatchSize is the maximum number of events per chunk. Default
	// BatchSizeDefault.
	BatchSize int
	// MaxWorkers caps the handlers this process runs at once, across all
	// the slots it owns. Default MaxWorkersDefault (256). Within a slot,
	// events are dispatched to one lane per partition key: each lane runs
	// one handler at a time in ev_id order, and the lanes of different keys
	// run concurrently, so parallelism follows the number of active keys,
	// not the number of slots. See docs/worker-pool.md.
	MaxWorkers int
	// MaxWorkersPerSlot caps the handlers running at once in one slot.
	// Default MaxWorkers. 1 turns lanes off: the slot handles its chunk one
	// event at a time and acknowledges it as a whole before fetching the
	// next, as a single goroutine per slot (MaxWorkers then does not apply).
	MaxWorkersPerSlot int
	// MaxEventsPerSlot caps the events a slot holds in this process: the
	// chunk being handled plus the remaining events of slow keys whose
	// lanes run on after their chunk was acknowledged. While the cap would
	// be exceeded, the slot does not fetch. Default MaxEventsPerSlotFactor
	// × BatchSize; at least BatchSize.
	MaxEventsPerSlot int
	// HoldAfter is how long the last few lanes of a chunk may keep it open,
	// and how long their handler must have run, before their keys are held
	// and the slot fetches on (docs/worker-pool.md, "No chunk barrier").
	// Default HoldAfterDefault (50 ms). A key with many fast events is
	// held only when its events left in the chunk would take ten times
	// HoldAfter (or have kept the chunk open that long), so a shorter share
	// is waited for, and the other keys of its slot with it; a HoldAfter
	// below the handlers' time holds such keys sooner, for their
	// neighbours' sake, at the cost of the hot key's own latency (each hold
	// sends its later events through the server and back).
	HoldAfter time.Duration
	// Handler processes each message. Exactly one of Handler and HandlerTx
	// is required.
	Handler HandlerFunc
	// HandlerTx processes each message in a transaction whose writes commit
	// together with the event's completion, fenced by the slot's lease
	// (exactly-once effects, see HandlerTxFunc): a worker that lost the
	// lease cannot commit. Exactly one of Handler and HandlerTx is required.
	HandlerTx HandlerTxFunc
	// HandlerTimeout, when positive, bounds each handler call as in
	// ConsumerConfig.HandlerTimeout. Zero means no timeout.
	HandlerTimeout time.Duration
	// FailurePolicy is what a handler failure does to the key. Zero keeps the
	// policy persisted for (queue, consumer), which is FailurePolicyDefault
	// for a new consumer. Any other value is persisted with the consumer's
	// first slot; when a different policy is already persisted, Start fails
	// with ErrPolicyMismatch (change it with Client.SetFailurePolicy). The
	// pool follows the persisted policy: if it is changed while the pool
	// runs, a chunk with failures that was handled under the old policy is
	// not acknowledged but handled again under the new one.
	FailurePolicy FailurePolicy
	// RetryDelay returns how long a failed event waits before redelivery.
	// Default RetryDelayDefault.
	RetryDelay func(retryCount int) time.Duration
	// StartFromOldest, when Start creates the consumer's subscription,
	// starts it at the oldest event the queue still keeps for its other
	// subscriptions instead of at the next tick (see
	// Client.SubscribeSlotsFromOldest). It changes nothing for a consumer
	// that is already subscribed. The safe order needs no option: subscribe
	// (Client.SubscribeSlots, `pgque slots subscribe`) before the
	// producers start. Start logs a warning when it creates a subscription
	// that misses events already sent.
	StartFromOldest bool
	// OnSlot, when set, is called when this process starts working a slot
	// (it claimed the slot's lease) and when it stops (Stop, its fair share,
	// a resize, or a fence when the lease expired or another process took
	// it). Between the two the slot's events come to this process, as a
	// Kafka consumer's partitions between assignment and revocation: the
	// place to log lease moves or keep per-slot state. It runs on the
	// pool's goroutines and must return quickly.
	OnSlot func(SlotChange)
}

// SlotChange is a slot a PartitionedConsumer started or stopped working
// (PartitionedConsumerConfig.OnSlot).
type SlotChange struct {
	Slot, NSlots int
	// Epoch is the lease's: each claim of a slot has a greater one.
	Epoch int64
	// Ended is false when the process claimed the slot and starts working
	// it, true when it stopped.
	Ended bool
	// Fenced, with Ended: the process fenced the slot, because its lease
	// expired or another process holds it now.
	Fenced bool
}

func (c *PartitionedConsumerConfig) withDefaults() PartitionedConsumerConfig {
	out := *c
	if out.MaxActiveSlots == 0 {
		out.MaxActiveSlots = out.Slots
	}
	if out.WorkerID == "" {
		out.WorkerID = defaultWorkerID()
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = LeaseTTLDefault
	}
	if out.ClaimInterval == 0 {
		out.ClaimInterval = ClaimIntervalDefault
	}
	if out.PollInterval == 0 {
		out.PollInterval = PollIntervalDefault
	}
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	if out.MaxWorkers == 0 {
		out.MaxWorkers = MaxWorkersDefault
	}
	if out.MaxWorkersPerSlot == 0 {
		out.MaxWorkersPerSlot = out.MaxWorkers
	}
	if out.HoldAfter == 0 {
		out.HoldAfter = HoldAfterDefault
	}
	if out.MaxEventsPerSlot == 0 {
		out.MaxEventsPerSlot = MaxEventsPerSlotFactor * out.BatchSize
	}
	if out.HotKeyShare == 0 {
		out.HotKeyShare = HotKeyShareDefault
	}
	if out.RetryDelay == nil {
		out.RetryDelay = RetryDelayDefault
	}
	return out
}

func (c *PartitionedConsumerConfig) validate() error {
	switch {
	case c == nil:
		return invalidConfig("PartitionedConsumerConfig is nil")
	case c.Queue == "":
		return invalidConfig("PartitionedConsumerConfig.Queue is empty")
	case c.Consumer == "":
		return invalidConfig("PartitionedConsumerConfig.Consumer is empty")
	case c.Handler == nil && c.HandlerTx == nil:
		return invalidConfig("PartitionedConsumerConfig.Handler and HandlerTx are nil: set one")
	case c.Handler != nil && c.HandlerTx != nil:
		return invalidConfig("PartitionedConsumerConfig.Handler and HandlerTx are both set: set one")
	case checkText(c.Queue, NameMaxBytes) != "":
		return invalidConfig("PartitionedConsumerConfig.Queue %s", checkText(c.Queue, NameMaxBytes))
	case checkText(c.Consumer, NameMaxBytes) != "":
		return invalidConfig("PartitionedConsumerConfig.Consumer %s", checkText(c.Consumer, NameMaxBytes))
	case c.Slots < 1 || c.Slots > SlotsMax:
		return invalidConfig("PartitionedConsumerConfig.Slots must be between 1 and %d (got %d)", SlotsMax, c.Slots)
	case c.MaxActiveSlots < 0 || c.MaxActiveSlots > c.Slots:
		return invalidConfig("PartitionedConsumerConfig.MaxActiveSlots must be between 0 and Slots (%d), not %d", c.Slots, c.MaxActiveSlots)
	case c.WorkerID != "" && checkText(c.WorkerID, WorkerIDMaxBytes) != "":
		return invalidConfig("PartitionedConsumerConfig.WorkerID %s", checkText(c.WorkerID, WorkerIDMaxBytes))
	case c.LeaseTTL != 0 && c.LeaseTTL < LeaseTTLMin:
		return invalidConfig("PartitionedConsumerConfig.LeaseTTL %v is below the minimum %v", c.LeaseTTL, LeaseTTLMin)
	case c.LeaseTTL > LeaseTTLMax:
		return invalidConfig("PartitionedConsumerConfig.LeaseTTL %v is above the maximum %v", c.LeaseTTL, LeaseTTLMax)
	case c.ClaimInterval < 0 || c.PollInterval < 0:
		return invalidConfig("PartitionedConsumerConfig intervals must not be negative")
	case c.ClaimInterval != 0 && c.ClaimInterval < ClaimIntervalMin:
		return invalidConfig("PartitionedConsumerConfig.ClaimInterval %v is below the minimum %v", c.ClaimInterval, ClaimIntervalMin)
	case c.ClaimInterval > ClaimIntervalMax:
		return invalidConfig("PartitionedConsumerConfig.ClaimInterval %v is above the maximum %v (a worker's presence lasts three, and is kept 10 minutes at most)", c.ClaimInterval, ClaimIntervalMax)
	case c.BatchSize < 0 || c.BatchSize > BatchSizeMax:
		return invalidConfig("PartitionedConsumerConfig.BatchSize must be between 1 and %d (got %d)", BatchSizeMax, c.BatchSize)
	case c.HoldAfter < 0:
		return invalidConfig("PartitionedConsumerConfig.HoldAfter (%s) must not be negative", c.HoldAfter)
	case c.MaxWorkers < 0 || c.MaxWorkersPerSlot < 0:
		return invalidConfig("PartitionedConsumerConfig.MaxWorkers (%d) and MaxWorkersPerSlot (%d) must not be negative", c.MaxWorkers, c.MaxWorkersPerSlot)
	case c.MaxEventsPerSlot < 0 || (c.MaxEventsPerSlot > 0 && c.MaxEventsPerSlot < max(c.BatchSize, 1)):
		return invalidConfig("PartitionedConsumerConfig.MaxEventsPerSlot %d must be at least BatchSize (%d)", c.MaxEventsPerSlot, c.BatchSize)
	case c.HotKeyShare > 1:
		return invalidConfig("PartitionedConsumerConfig.HotKeyShare %v is above 1", c.HotKeyShare)
	case c.FailurePolicy != 0 && !c.FailurePolicy.valid():
		return invalidConfig("PartitionedConsumerConfig.FailurePolicy %v is not supported", c.FailurePolicy)
	case c.HandlerTimeout < 0:
		return invalidConfig("PartitionedConsumerConfig.HandlerTimeout is negative (%v)", c.HandlerTimeout)
	}
	return nil
}

// defaultWorkerID is hostname-pid-random: unique per process, and readable
// in partition_slot_status.
func defaultWorkerID() string {
	host, err := os.Hostname()
	if err != nil || host == "" || checkText(host, 100) != "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
