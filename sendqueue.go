package pgque

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Coalescing Client.Send.
//
// A send is one PL/pgSQL call, and the call costs the server about as much
// as the INSERT it makes (docs/design.md, "The floor of a function send"),
// while send_batch pays that call once for a whole array. So Client.Send
// keeps at most Config.SendConcurrency statements running; a Send that
// finds them all busy waits, and when one finishes, everything that waited
// for the same queue goes out in one send_batch call, whatever the types.
// A Send that finds a statement free runs its own, on its own goroutine
// and context, exactly as an uncoalesced Send would: nothing waits for
// company, so an idle or lightly loaded client adds no latency, and
// batches form only when sends arrive faster than the statements return.
//
// Three rules keep one stuck statement from holding up the rest. Sends
// with a dedup key are never coalesced: they wait for an open transaction
// that sent the same key until it ends, and in a batch they would hold
// every other event of it back. A Send that has waited sendPatience
// without getting a statement leaves the queue and runs its own: when
// every statement is stuck (a lock on one queue's table, say), Sends to
// other queues are delayed by that much, not stopped. And no queue runs
// more than half the pool's connections in statements at once, nor one
// dedup key more than one (sendGates): a Send past that waits without a
// connection, so that the Sends piling up behind a stuck queue or key
// leave the rest of the pool to other queues.

const (
	// sendConcurrencyDefault is Config.SendConcurrency's zero value.
	sendConcurrencyDefault = 4
	// sendBatchMax bounds the events one coalesced statement carries.
	sendBatchMax = 1000
	// sendBatchBytes bounds the payload bytes one coalesced statement
	// carries, so that large payloads never build an array near the
	// server's 1 GB value limit (or a statement that holds everyone up).
	// A payload larger than this goes alone.
	sendBatchBytes = 4 << 20
	// sendPatience is how long a Send waits for a statement before it
	// runs its own. A coalesced statement of 1000 events takes about
	// 5 ms on two cores (send_batch_text_1000), so this passes only when
	// statements are stuck or the server is far behind.
	sendPatience = 100 * time.Millisecond
)

// Request states: a waiting request may still be abandoned by its caller;
// once taken into a statement it no longer can.
const (
	reqWaiting int32 = iota
	reqTaken
	reqAbandoned
)

// sendReq is one waiting Send.
type sendReq struct {
	queue   string
	typ     string
	payload json.RawMessage
	key     *string
	state   atomic.Int32
	done    chan sendResult // buffered: the flusher never blocks on it
}

type sendResult struct {
	id  int64
	err error
}

// sendQueue holds the Sends that wait for a statement.
type sendQueue struct {
	client   *Client
	limit    int
	patience time.Duration
	// perQueue bounds the statements one queue runs at once (0: no
	// bound); gates counts them, and those of each dedup key.
	perQueue int
	gates    sendGates

	mu       sync.Mutex
	pending  []*sendReq
	inflight int
	// compactAt is the length of pending at which send drops the
	// abandoned requests.
	compactAt int
	// statements and batched count coalesced statements and the events
	// they carried (for tests and the send_coalesced measurements).
	statements atomic.Int64
	batched    atomic.Int64
	// bypassed counts Sends that ran their own statement after
	// sendPatience.
	bypassed atomic.Int64
	// alone counts events sent again one by one after their coalesced
	// statement failed.
	alone atomic.Int64
}

func newSendQueue(c *Client, limit int) *sendQueue {
	if limit < 0 {
		return nil
	}
	if limit == 0 {
		limit = sendConcurrencyDefault
	}
	perQueue := max(1, int(c.pool.Config().MaxConns)/2)
	return &sendQueue{client: c, limit: limit, patience: sendPatience, perQueue: perQueue, compactAt: 64}
}

// sendKeyed runs a Send with a dedup key: never coalesced, and one
// statement per key at a time (the second would only wait for the first
// on the server, holding a connection), within the queue's share.
func (s *sendQueue) sendKeyed(ctx context.Context, queue string, ev Event) (int64, error) {
	key := keyGate(queue, ev.DedupKey)
	if err := s.gates.acquire(ctx, key, 1); err != nil {
		return 0, fmt.Errorf("sending to queue %q: %w", queue, err)
	}
	defer s.gates.release(key)
	if err := s.gates.acquire(ctx, queueGate(queue), s.perQueue); err != nil {
		return 0, fmt.Errorf("sending to queue %q: %w", queue, err)
	}
	defer s.gates.release(queueGate(queue))
	return s.client.send(ctx, s.client.queries, queue, ev)
}

// send runs r's statement now if one is free, or waits for a coalesced one.
func (s *sendQueue) send(ctx context.Context, r *sendReq) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("sending to queue %q: %w", r.queue, err)
	}
	gate := queueGate(r.queue)
	s.mu.Lock()
	if s.inflight < s.limit && len(s.pending) == 0 && s.gates.tryAcquire(gate, s.perQueue) {
		s.inflight++
		s.mu.Unlock()
		id, err := s.client.sendOne(ctx, s.client.queries, r.queue, r.typ, r.payload, r.key, nil)
		s.gates.release(gate)
		s.release()
		return id, err
	}
	r.done = make(chan sendResult, 1)
	if len(s.pending) >= s.compactAt {
		// Only take drops abandoned requests, and while every statement
		// is stuck nothing takes: drop them here too, so a long stall
		// does not keep every payload sent during it.
		s.compact()
		s.compactAt = max(64, 2*len(s.pending))
	}
	s.pending = append(s.pending, r)
	if s.inflight < s.limit {
		// A statement is free, but the requests before this one are for
		// queues at their share: this one need not wait behind them.
		if batch := s.take(); batch != nil {
			s.inflight++
			go s.drain(batch)
		}
	}
	s.mu.Unlock()
	patience := time.NewTimer(s.patience)
	defer patience.Stop()
	select {
	case res := <-r.done:
		return res.id, res.err
	case <-patience.C:
		if r.state.CompareAndSwap(reqWaiting, reqAbandoned) {
			s.bypassed.Add(1)
			if err := s.gates.acquire(ctx, gate, s.perQueue); err != nil {
				return 0, fmt.Errorf("sending to queue %q: %w", r.queue, err)
			}
			defer s.gates.release(gate)
			return s.client.sendOne(ctx, s.client.queries, r.queue, r.typ, r.payload, r.key, nil)
		}
		select { // taken just now
		case res := <-r.done:
			return res.id, res.err
		case <-ctx.Done():
			return 0, fmt.Errorf("sending to queue %q: %w", r.queue, ctx.Err())
		}
	case <-ctx.Done():
		// Still waiting: it is dropped and never sent. Already taken: the
		// statement runs on, and the event may be committed, as with any
		// statement whose context ends while it runs.
		r.state.CompareAndSwap(reqWaiting, reqAbandoned)
		return 0, fmt.Errorf("sending to queue %q: %w", r.queue, ctx.Err())
	}
}

// release gives back a statement, or hands it to the waiting sends.
func (s *sendQueue) release() {
	s.mu.Lock()
	batch := s.take()
	if batch == nil {
		s.inflight--
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	go s.drain(batch)
}

// drain sends batches until nobody waits; it holds one statement slot,
// and each batch a place in its queue's gate (taken by take).
func (s *sendQueue) drain(batch []*sendReq) {
	for batch != nil {
		s.flush(context.Background(), batch)
		s.gates.release(queueGate(batch[0].queue))
		s.mu.Lock()
		batch = s.take()
		if batch == nil {
			s.inflight--
		}
		s.mu.Unlock()
	}
}

// compact drops the abandoned requests from pending. s.mu is held.
func (s *sendQueue) compact() {
	kept := s.pending[:0]
	for _, r := range s.pending {
		if r.state.Load() != reqAbandoned {
			kept = append(kept, r)
		}
	}
	clear(s.pending[len(kept):])
	s.pending = kept
}

// take removes and returns the next statement's requests: the oldest
// waiting request whose queue has a place in its gate (which take takes
// for the batch) and every later one for the same queue, of any type (the
// mixed-type send_batch keeps each event's type), up to sendBatchMax events
// and sendBatchBytes of payload (the first request always goes, whatever
// its size). Abandoned requests are dropped on the way. It returns nil when
// nothing waits that may run. s.mu is held.
func (s *sendQueue) take() []*sendReq {
	var batch []*sendReq
	var head *sendReq
	var full map[string]bool // queues found at their share
	bytes := 0
	kept := s.pending[:0]
	for _, r := range s.pending {
		if r.state.Load() == reqAbandoned {
			continue
		}
		if head == nil {
			if !full[r.queue] && s.gates.tryAcquire(queueGate(r.queue), s.perQueue) {
				if r.state.CompareAndSwap(reqWaiting, reqTaken) {
					head, batch, bytes = r, append(batch, r), len(r.payload)
					continue
				}
				s.gates.release(queueGate(r.queue)) // abandoned just now
				continue
			}
			if full == nil {
				full = map[string]bool{}
			}
			full[r.queue] = true
		} else if r.queue == head.queue && len(batch) < sendBatchMax && bytes+len(r.payload) <= sendBatchBytes &&
			r.state.CompareAndSwap(reqWaiting, reqTaken) {
			batch = append(batch, r)
			bytes += len(r.payload)
			continue
		}
		if r.state.Load() != reqAbandoned {
			kept = append(kept, r)
		}
	}
	clear(s.pending[len(kept):]) // let the taken and dropped requests go
	s.pending = kept
	return batch
}

// flush sends batch in one statement and tells each request its outcome.
// A batch the server refuses for what one of its events holds is sent
// again event by event, so that each Send gets its own result and no good
// event fails for a bad neighbour. Any other error is given to all: one
// that concerns the statement (a missing queue, a permission, a timeout, a
// lock) would fail each event alike, and slowly, and after a lost
// connection the outcome is unknown, so sending again could duplicate.
func (s *sendQueue) flush(ctx context.Context, batch []*sendReq) {
	c := s.client
	head := batch[0]
	if len(batch) == 1 {
		id, err := c.sendOne(ctx, c.queries, head.queue, head.typ, head.payload, head.key, nil)
		head.done <- sendResult{id, err}
		return
	}
	s.statements.Add(1)
	s.batched.Add(int64(len(batch)))
	var b encodedBatch
	for _, req := range batch {
		b.add(req.typ, req.payload, req.key, nil)
	}
	ids, err := c.sendBatch(ctx, c.queries, head.queue, b)
	if err == nil && len(ids) != len(batch) {
		err = fmt.Errorf("sending to queue %q: send_batch returned %d ids for %d events", head.queue, len(ids), len(batch))
	}
	if err == nil {
		for i, req := range batch {
			req.done <- sendResult{id: ids[i]}
		}
		return
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !eventError(pgErr.Code) {
		for _, r := range batch {
			r.done <- sendResult{err: err}
		}
		return
	}
	s.alone.Add(int64(len(batch)))
	for _, r := range batch {
		id, err := c.sendOne(ctx, c.queries, r.queue, r.typ, r.payload, r.key, nil)
		r.done <- sendResult{id, err}
	}
}

// eventError reports whether a send's SQLSTATE can come from what one
// event holds: its payload, type or key (data exceptions, class 22;
// integrity violations, 23; values past a limit, 54; pgque's argument
// errors), rather than from the queue, the role or the server.
func eventError(code string) bool {
	switch {
	case code == "PQ001": // queue not found
		return false
	case strings.HasPrefix(code, "PQ"):
		return true
	}
	if len(code) < 2 {
		return false
	}
	switch code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}
