package pgque

import (
	"context"
	"sync"
)

// sendGates bounds how many of Client.Send's statements run at once for
// one name: a queue (a share of the pool) or one dedup key of a queue
// (one). A statement stuck on a lock (a queue's table locked, a key held
// by an open transaction that sent it) holds its pool connection until the
// lock goes; without a bound, the Sends that pile up behind it took every
// connection, and Sends to other queues could not run at all. A Send that
// finds its gate full waits without a connection.
type sendGates struct {
	mu   sync.Mutex
	held map[string]*gate
}

// gate is one name's count of running statements. wake is closed, and
// replaced, whenever a statement leaves, so that waiters look again.
type gate struct {
	n    int
	wake chan struct{}
}

// queueGate and keyGate name the gates: NUL is in no queue name and in no
// PostgreSQL text, so the names cannot meet.
func queueGate(queue string) string    { return "q\x00" + queue }
func keyGate(queue, key string) string { return "k\x00" + queue + "\x00" + key }

// tryAcquire takes a place in name's gate if fewer than limit hold one;
// limit 0 means no bound.
func (g *sendGates) tryAcquire(name string, limit int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.enter(name, limit)
	return ok
}

// enter is tryAcquire with g.mu held; it returns the gate either way.
func (g *sendGates) enter(name string, limit int) (*gate, bool) {
	if g.held == nil {
		g.held = map[string]*gate{}
	}
	e := g.held[name]
	if e == nil {
		e = &gate{wake: make(chan struct{})}
		g.held[name] = e
	}
	if limit > 0 && e.n >= limit {
		return e, false
	}
	e.n++
	return e, true
}

// acquire waits for a place in name's gate, or for ctx to end.
func (g *sendGates) acquire(ctx context.Context, name string, limit int) error {
	for {
		g.mu.Lock()
		e, ok := g.enter(name, limit)
		wake := e.wake
		g.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives back a place taken by tryAcquire or acquire.
func (g *sendGates) release(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.held[name]
	e.n--
	close(e.wake)
	e.wake = make(chan struct{})
	if e.n == 0 {
		delete(g.held, name)
	}
}
