package pgque

import (
	"context"
	"sync"
	"time"

	"github.com/pgque/pgque/internal/dbq"
)

// Exports for the external tests (package pgque_test).

// ConsumerStopping is closed once Stop was called on con and told it to
// stop fetching.
func ConsumerStopping(con *Consumer) <-chan struct{} { return con.service.Stopping() }

// PartitionedStopping is closed once Stop was called on pc and told it to
// stop fetching.
func PartitionedStopping(pc *PartitionedConsumer) <-chan struct{} { return pc.service.Stopping() }

// SetAnnounceGrace sets how long a graceful stop of pc lets a claim
// pass's announcement under way go on; call it before Start.
func SetAnnounceGrace(pc *PartitionedConsumer, d time.Duration) { pc.pool.SetAnnounceGrace(d) }

// SendCounts is what a client's Send coalescing did.
type SendCounts struct {
	Statements int64 // coalesced statements
	Events     int64 // events they carried
	Bypassed   int64 // Sends that ran their own statement after the patience
	Alone      int64 // events sent again one by one after a failed statement
}

// SendCounters returns client's SendCounts.
func SendCounters(client *Client) SendCounts {
	s := client.sends
	if s == nil {
		return SendCounts{}
	}
	return SendCounts{s.statements.Load(), s.batched.Load(), s.bypassed.Load(), s.alone.Load()}
}

// SetSendPatience sets how long client's Sends wait for a statement.
func SetSendPatience(client *Client, d time.Duration) { client.sends.patience = d }

// SendsWaiting returns how many Sends wait for a statement.
func SendsWaiting(client *Client) int {
	if client.sends == nil {
		return 0
	}
	client.sends.mu.Lock()
	defer client.sends.mu.Unlock()
	return len(client.sends.pending)
}

// TickerStopping is closed once Stop was called on tk and told it to stop.
func TickerStopping(tk *Ticker) <-chan struct{} { return tk.service.Stopping() }

// TickerRefused returns how many of tk's lease requests another ticker's
// lease refused.
func TickerRefused(tk *Ticker) int64 { return tk.ticker.Refused() }

// NotifierSessions returns how many LISTEN sessions client's notifier has
// opened so far (0 without a notifier).
func NotifierSessions(client *Client) int64 {
	if client.notifier == nil {
		return 0
	}
	return client.notifier.Sessions()
}

// NotifierProbes returns how many of client's LISTEN sessions got their
// probe back and how many did not (see notifier.ProbeChannel).
func NotifierProbes(client *Client) (ok, failed int64) {
	if client.notifier == nil {
		return 0, 0
	}
	return client.notifier.Probes()
}

// SetWorkHook makes pc tell hook the slot of every chunk call its pool
// makes. Call it before Start.
func SetWorkHook(pc *PartitionedConsumer, hook func(slot int)) { pc.workHook = hook }

// SetAckFoldWait sets how long pc's deferred acknowledgements wait for
// their slot's next wake-up. Call it before Start.
func SetAckFoldWait(pc *PartitionedConsumer, d time.Duration) { pc.ackFoldWait = d }

// TouchedSets reports whether pc's pool has received a touched set, from
// which on only touched slots wake on a tick.
func TouchedSets(pc *PartitionedConsumer) bool { return pc.pool.TouchedSets() }

// GatheredCalls returns how many receives for more than one slot pc made
// (gather.go).
func GatheredCalls(pc *PartitionedConsumer) int64 {
	if pc.gather == nil {
		return 0
	}
	return pc.gather.calls.Load()
}

// SetGatherWindow sets how long pc's woken receives wait for each other;
// call it before Start.
func SetGatherWindow(pc *PartitionedConsumer, d time.Duration) { pc.gather.window = d }

// GatherReceive makes, through pc's gathering, one receive for each of
// calls, all started at once, and returns each one's rows and error.
func GatherReceive(ctx context.Context, pc *PartitionedConsumer, calls []dbq.SlotReceive) ([][]dbq.Row, []error) {
	rows, errs := make([][]dbq.Row, len(calls)), make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows[i], errs[i] = pc.gather.receive(ctx, ctx, c)
		}()
	}
	wg.Wait()
	return rows, errs
}
