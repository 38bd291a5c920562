package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/dbq"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// The end-to-end scenario: 200 tenants, 3 relay processes over 8 slots
// under the pause policy, a Node.js handler with random latencies that
// fails the first delivery of some events with 500, and one poison event
// answered 422.
const (
	e2eSlots   = 8
	e2eTenants = 200
	e2eEvents  = 2400
	e2eQueue   = "files"
	e2eCons    = "storage"
)

// specialKeys are tenants whose keys need care in a header: the empty key,
// non-ASCII, control characters, '%' and '/'. The NULL key is one more.
var specialKeys = []string{"", "tenant/ünïcødé ✓", "tab\there\r\nnewline", "100%", "a+b=c&d"}

// sentEvent is one event the test sent.
type sentEvent struct {
	id  int64
	key *string
}

// scenario is a running end-to-end setup.
type scenario struct {
	dsn     string
	pool    *pgxpool.Pool
	handler *nodeHandler
	relays  []*relayProc
	sent    []sentEvent
	poison  int64
}

// e2eKey returns tenant i's key (nil: the NULL key).
func e2eKey(i int) *string {
	switch {
	case i < len(specialKeys):
		return &specialKeys[i]
	case i == len(specialKeys):
		return nil
	default:
		k := fmt.Sprintf("tenant-%03d", i)
		return &k
	}
}

func startScenario(t *testing.T, relayTicker bool) *scenario {
	t.Helper()
	needNode(t)
	s := &scenario{dsn: pgtest.NewInstalledDB(t)}
	s.pool = pgtest.Pool(t, s.dsn)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `select pgque.create_queue($1)`, e2eQueue); err != nil {
		t.Fatal(err)
	}
	// Retries are plenty: only the poison event may be dead-lettered.
	if _, err := s.pool.Exec(ctx, `select pgque.set_queue_config($1, 'max_retries', '50')`, e2eQueue); err != nil {
		t.Fatal(err)
	}
	s.handler = startNodeHandler(t, "MAX_LATENCY_MS=12", "FAIL_EVERY=41")
	to := "http://127.0.0.1:" + strconv.Itoa(s.handler.port) + "/events"
	for i := range 3 {
		args := []string{"--queue", e2eQueue, "--consumer", e2eCons, "--slots", strconv.Itoa(e2eSlots), "--to", to,
			"--policy", "pause", "--lease-ttl", "2s", "--claim-interval", "200ms", "--poll-interval", "200ms",
			"--retry-min", "100ms", "--retry-max", "400ms", "--timeout", "5s", "--batch-size", "50"}
		if relayTicker {
			args = append(args, "--ticker", "--retry-interval", "100ms")
		}
		s.relays = append(s.relays, startRelay(t, s.dsn, "relay-"+strconv.Itoa(i), args...))
	}
	if !relayTicker {
		startTestTicker(t, s.dsn)
	}
	// Events sent before the consumer subscribed would not be delivered
	// to it: wait until every slot is owned.
	pgtest.WaitFor(t, 30*time.Second, "every slot owned", func() bool {
		owned, _ := slotOwners(t, s.pool)
		return owned == e2eSlots
	})
	return s
}

// slotOwners counts live-owned slots and returns the owners.
func slotOwners(t *testing.T, pool *pgxpool.Pool) (int, map[int]string) {
	t.Helper()
	st, err := dbq.New(pool).PartitionSlotLeases(context.Background(), e2eQueue, e2eCons)
	if err != nil {
		return 0, nil
	}
	owners := map[int]string{}
	for _, s := range st {
		if s.Owner != nil && s.Live {
			owners[s.Slot] = *s.Owner
		}
	}
	return len(owners), owners
}

// send sends n events over the tenants in batches, each tenant's in
// order; the event at position poisonAt is the poison.
func (s *scenario) send(t *testing.T, from, n, poisonAt int) {
	t.Helper()
	ctx := context.Background()
	const batch = 200
	for off := from; off < from+n; off += batch {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := off; i < min(off+batch, from+n); i++ {
			key := e2eKey(rand.IntN(e2eTenants))
			payload := fmt.Sprintf(`{"n": %d}`, i)
			if i == poisonAt {
				payload = `{"poison": true}`
			}
			var id int64
			if err := tx.QueryRow(ctx, `select pgque.send($1, 'file.created', $2::jsonb, $3)`, e2eQueue, payload, key).Scan(&id); err != nil {
				t.Fatal(err)
			}
			s.sent = append(s.sent, sentEvent{id: id, key: key})
			if i == poisonAt {
				s.poison = id
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// resolvedCount is how many sent events have been answered 2xx (or 422,
// the poison).
func (s *scenario) resolvedCount(t *testing.T) int {
	done := map[int64]bool{}
	for _, r := range s.handler.records(t) {
		if r.Ph == "end" && (r.Status == 200 || r.Status == 422) {
			done[r.EvID] = true
		}
	}
	return len(done)
}

// waitAllResolved waits until every sent event was answered for good.
func (s *scenario) waitAllResolved(t *testing.T, timeout time.Duration) {
	t.Helper()
	pgtest.WaitFor(t, timeout, "every event handled", func() bool { return s.resolvedCount(t) >= len(s.sent) })
}

// check verifies the records against what was sent.
func (s *scenario) check(t *testing.T) {
	t.Helper()
	recs := s.handler.records(t)
	keyOf := map[int64]*string{}
	byKey := map[string][]int64{} // sent ids of each key, ascending
	for _, e := range s.sent {
		keyOf[e.id] = e.key
		byKey[kid(e.key)] = append(byKey[kid(e.key)], e.id)
	}
	resolved := map[int64]int{} // ev_id -> status it was resolved with
	inFlight := map[string]int64{}
	var fails500, overlaps, orderErrs int
	for _, r := range recs {
		k := kid(r.Key)
		switch r.Ph {
		case "start":
			if want, ok := keyOf[r.EvID]; !ok {
				t.Errorf("request for unknown ev_id %d", r.EvID)
				continue
			} else if kid(want) != k {
				t.Errorf("ev_id %d arrived with key %s, sent with %s", r.EvID, k, kid(want))
			}
			if other, busy := inFlight[k]; busy || r.Overlap {
				overlaps++
				if overlaps <= 5 {
					t.Errorf("two requests of key %s in flight at once: ev_id %d while %d", k, r.EvID, other)
				}
			}
			inFlight[k] = r.EvID
			if r.CEID != e2eQueue+"/"+strconv.FormatInt(r.EvID, 10) || r.CESpecVersion != "1.0" ||
				r.CESource != "pgque://"+e2eQueue+"/"+e2eCons || r.CEType != "file.created" ||
				r.ContentType != "application/json" || r.Epoch < 1 || r.Slot < 0 || r.Slot >= e2eSlots {
				t.Errorf("bad headers on ev_id %d: %+v", r.EvID, r)
			}
			if _, err := time.Parse(time.RFC3339Nano, r.CETime); err != nil {
				t.Errorf("ce-time %q of ev_id %d is not RFC 3339: %v", r.CETime, r.EvID, err)
			}
		case "end":
			delete(inFlight, k)
			switch r.Status {
			case 500:
				fails500++
				continue
			case 200, 422:
			default:
				t.Errorf("unexpected status %d for ev_id %d", r.Status, r.EvID)
				continue
			}
			if _, again := resolved[r.EvID]; again {
				continue // a redelivery after a crash: at least once
			}
			// Per-key order: every earlier event of the key was resolved
			// before this one.
			for _, id := range byKey[k] {
				if id >= r.EvID {
					break
				}
				if _, ok := resolved[id]; !ok {
					orderErrs++
					if orderErrs <= 5 {
						t.Errorf("key %s: ev_id %d handled before the earlier ev_id %d", k, r.EvID, id)
					}
					break
				}
			}
			resolved[r.EvID] = r.Status
		}
	}
	for _, e := range s.sent {
		st, ok := resolved[e.id]
		switch {
		case !ok:
			t.Errorf("ev_id %d (key %s) was never handled: lost", e.id, kid(e.key))
		case e.id == s.poison && st != 422:
			t.Errorf("poison ev_id %d resolved with %d", e.id, st)
		case e.id != s.poison && st != 200:
			t.Errorf("ev_id %d resolved with %d", e.id, st)
		}
	}
	if fails500 == 0 {
		t.Error("no request was answered 500: the retry path was not exercised")
	}
	// The dead-letter table holds the poison event, at its first delivery,
	// and nothing else.
	rows, err := s.pool.Query(context.Background(), `select ev_id, ev_retry from pgque.dlq_list($1, null, 100)`, e2eQueue)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var dead []string
	for rows.Next() {
		var id int64
		var retry int
		if err := rows.Scan(&id, &retry); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, fmt.Sprintf("%d/retry %d", id, retry))
	}
	if want := fmt.Sprintf("%d/retry 0", s.poison); len(dead) != 1 || dead[0] != want {
		t.Errorf("dead letters %v, want exactly [%s]", dead, want)
	}
	t.Logf("%d events over %d keys: %d requests, %d answered 500 then retried, poison %d dead-lettered",
		len(s.sent), len(byKey), len(recs)/2, fails500, s.poison)
}

func kid(k *string) string {
	if k == nil {
		return "NULL"
	}
	return strconv.Quote(*k)
}

// TestRelayEndToEnd: 3 relay processes (each also running a ticker) over
// 8 slots deliver 200 tenants' events to a Node.js handler: per key in
// order, never two requests of a key at once, nothing lost, the 500s
// retried, the poison event dead-lettered at once, CloudEvents headers
// and awkward keys intact.
func TestRelayEndToEnd(t *testing.T) {
	s := startScenario(t, true)
	s.send(t, 0, e2eEvents, e2eEvents/3)
	s.waitAllResolved(t, 60*time.Second)
	s.check(t)
}

// TestRelayKill9: one of 3 relays is killed with SIGKILL mid-run: the
// others take its slots over (after the lease TTL) and the run completes
// with nothing lost and every key in order.
func TestRelayKill9(t *testing.T) {
	s := startScenario(t, false)
	s.send(t, 0, e2eEvents/2, 100)
	// Kill mid-run: once part of the events are handled and the victim
	// owns slots (fair share hands it some after the others started
	// first), it has work in flight.
	victim := s.relays[0]
	var victimSlots []int
	pgtest.WaitFor(t, 30*time.Second, "a quarter of the events handled and the victim owning a slot", func() bool {
		if s.resolvedCount(t) < e2eEvents/4 {
			return false
		}
		_, owners := slotOwners(t, s.pool)
		victimSlots = victimSlots[:0]
		for slot, w := range owners {
			if w == victim.worker {
				victimSlots = append(victimSlots, slot)
			}
		}
		return len(victimSlots) > 0
	})
	victim.kill9(t)
	t.Logf("killed %s, owner of slots %v", victim.worker, victimSlots)
	s.send(t, e2eEvents/2, e2eEvents/2, -1)
	s.waitAllResolved(t, 60*time.Second)
	s.check(t)
	owned, owners := slotOwners(t, s.pool)
	if owned != e2eSlots {
		t.Errorf("%d of %d slots owned after the kill: %v", owned, e2eSlots, owners)
	}
	for slot, w := range owners {
		if w == victim.worker {
			t.Errorf("slot %d still owned by the killed %s", slot, w)
		}
	}
}
