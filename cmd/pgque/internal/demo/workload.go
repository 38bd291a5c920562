package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque"
)

// Event types of the workload.
const (
	TypeCreated     = "FileCreated"
	TypeOverwritten = "FileOverwritten"
	TypeDeleted     = "FileDeleted"
)

// payload is the body of every workload event. It carries the file's state
// after the event, so that applying events is a plain, idempotent write.
type payload struct {
	Tenant  string `json:"tenant"`
	Seq     int    `json:"seq"`
	File    string `json:"file"`
	Version int    `json:"version"`
}

// fileState is one file's state.
type fileState struct {
	Version int
	Deleted bool
}

// genEvent is one generated event.
type genEvent struct {
	typ string
	p   payload
}

// tenantGen generates one tenant's valid lifecycle. It keeps every event
// it generated and how many of them were sent (committed), so that the
// expected final state is that of exactly the events sent.
type tenantGen struct {
	name   string
	seq    int
	files  map[string]fileState // state after every generated event
	live   []string             // files not deleted, in creation order
	next   int                  // number for the next new file
	events []genEvent
	sent   int // events[:sent] were committed
}

func newTenantGen(name string) *tenantGen {
	return &tenantGen{name: name, files: map[string]fileState{}}
}

// nextEvent returns the tenant's next event: a new file when none is live
// (and sometimes otherwise), else an overwrite or a delete of a live file.
func (g *tenantGen) nextEvent(rng *rand.Rand) (typ string, p payload) {
	g.seq++
	p = payload{Tenant: g.name, Seq: g.seq}
	switch r := rng.Float64(); {
	case len(g.live) == 0 || r < 0.35:
		g.next++
		p.File, p.Version = fmt.Sprintf("f%d", g.next), 1
		g.files[p.File] = fileState{Version: 1}
		g.live = append(g.live, p.File)
		typ = TypeCreated
	case r < 0.85:
		p.File = g.live[rng.IntN(len(g.live))]
		st := g.files[p.File]
		st.Version++
		g.files[p.File] = st
		p.Version = st.Version
		typ = TypeOverwritten
	default:
		i := rng.IntN(len(g.live))
		p.File = g.live[i]
		g.live = append(g.live[:i], g.live[i+1:]...)
		st := g.files[p.File]
		st.Deleted = true
		g.files[p.File] = st
		p.Version = st.Version
		typ = TypeDeleted
	}
	g.events = append(g.events, genEvent{typ: typ, p: p})
	return typ, p
}

// expected replays the events sent and returns the state they lead to, or
// an error naming the first event that breaks the lifecycle.
func (g *tenantGen) expected() (map[string]fileState, error) {
	state := map[string]fileState{}
	for i, ev := range g.events[:g.sent] {
		p := ev.p
		st, exists := state[p.File]
		switch {
		case p.Seq != i+1 || p.Tenant != g.name:
			return nil, fmt.Errorf("%s event %d is %+v", g.name, i+1, p)
		case ev.typ == TypeCreated && (exists || p.Version != 1):
			return nil, fmt.Errorf("%s seq %d creates %s again", g.name, p.Seq, p.File)
		case ev.typ != TypeCreated && (!exists || st.Deleted):
			return nil, fmt.Errorf("%s seq %d: %s of missing %s", g.name, p.Seq, ev.typ, p.File)
		case ev.typ == TypeOverwritten && p.Version != st.Version+1:
			return nil, fmt.Errorf("%s seq %d overwrites %s v%d with v%d", g.name, p.Seq, p.File, st.Version, p.Version)
		case ev.typ == TypeDeleted && p.Version != st.Version:
			return nil, fmt.Errorf("%s seq %d deletes %s v%d as v%d", g.name, p.Seq, p.File, st.Version, p.Version)
		}
		state[p.File] = fileState{Version: p.Version, Deleted: ev.typ == TypeDeleted}
	}
	return state, nil
}

// sendBatchSize is how many events a producer sends per transaction.
const sendBatchSize = 50

// producer owns some tenants and sends their events, batch by batch, each
// batch in one transaction (so per-tenant order is the ev_id order).
type producer struct {
	client  *pgque.Client
	queue   string
	tenants []*tenantGen
	events  int     // how many to send
	rate    float64 // events/s for this producer, 0: unlimited
	until   time.Time
	rng     *rand.Rand
	commits *commitLog
	sent    *atomic.Int64 // shared by every producer
}

// run sends the producer's events; it stops early at p.until or when ctx
// ends.
func (p *producer) run(ctx context.Context) error {
	start := time.Now()
	sent := 0
	batch := make([]pgque.Event, 0, sendBatchSize)
	gens := make([]*tenantGen, 0, sendBatchSize)
	for sent < p.events {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !p.until.IsZero() && time.Now().After(p.until) {
			return nil
		}
		batch = batch[:0]
		gens = gens[:0]
		for len(batch) < sendBatchSize && sent+len(batch) < p.events {
			g := p.tenants[p.rng.IntN(len(p.tenants))]
			typ, pl := g.nextEvent(p.rng)
			batch = append(batch, pgque.Event{Type: typ, Payload: pl, PartitionKey: g.name})
			gens = append(gens, g)
		}
		ids, err := p.client.SendBatch(ctx, p.queue, batch)
		if err != nil {
			return fmt.Errorf("producing: %w", err)
		}
		p.commits.record(ids, time.Now())
		for _, g := range gens {
			g.sent++
		}
		sent += len(ids)
		p.sent.Add(int64(len(ids)))
		if p.rate > 0 {
			due := start.Add(time.Duration(float64(sent) / p.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(d):
				}
			}
		}
	}
	return nil
}

// commitLog records when each event's transaction committed and when its
// first delivery started, for the latency figures.
type commitLog struct {
	mu     sync.Mutex
	commit map[int64]time.Time
	start  map[int64]time.Time
}

func newCommitLog(n int) *commitLog {
	return &commitLog{commit: make(map[int64]time.Time, n), start: make(map[int64]time.Time, n)}
}

func (c *commitLog) record(ids []int64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		c.commit[id] = at
	}
}

// started records the first handler start of ev_id.
func (c *commitLog) started(id int64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.start[id]; !ok {
		c.start[id] = at
	}
}

// latencies returns commit → first handler start for every event that has
// both. An event whose handler started before its producer took the commit
// timestamp counts as zero.
func (c *commitLog) latencies() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Duration, 0, len(c.start))
	for id, s := range c.start {
		if t, ok := c.commit[id]; ok {
			out = append(out, max(0, s.Sub(t)))
		}
	}
	return out
}
