package enginetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// setupAPI gives an api test a database with queue "q", the given plain
// consumers subscribed through the api, and a pool on it.
func setupAPI(t *testing.T, consumers ...string) beginner {
	t.Helper()
	_, pool := setupDB(t)
	if n := scalar[int32](t, pool, "select pgque.create_queue('q')"); n != 1 {
		t.Fatalf("create_queue = %d", n)
	}
	for _, c := range consumers {
		if n := scalar[int32](t, pool, "select pgque.subscribe('q', $1)", c); n != 1 {
			t.Fatalf("subscribe(q, %s) = %d, want 1", c, n)
		}
	}
	return pool
}

// receiveAll receives and acks until nothing is left (without ticking).
func receiveAll(t testing.TB, q db, consumer string, max int) []message {
	t.Helper()
	var out []message
	for range 10000 {
		ms := mustReceive(t, q, "q", consumer, max)
		if len(ms) == 0 {
			return out
		}
		out = append(out, ms...)
		ack(t, q, ms[0].BatchID)
	}
	t.Fatal("receiveAll: too many chunks")
	return nil
}

// TestRetryRedeliversToThatConsumerOnly: nack schedules an event for
// redelivery after the delay, to the nacking consumer only, with
// retry_count + 1 and the partition key, type, payload and ev_id preserved;
// it is not redelivered before the delay.
func TestRetryRedeliversToThatConsumerOnly(t *testing.T) {
	t.Parallel()
	pool := setupAPI(t, "a", "b")
	const delay = 1500 * time.Millisecond

	id := scalar[int64](t, pool, `select pgque.send('q', 'file.created', '{"file": 7}'::jsonb, 'tenant-7')`)
	other := scalar[int64](t, pool, `select pgque.send('q', 'file.created', '{"file": 8}'::jsonb, 'tenant-8')`)
	tick(t, pool, "q")

	ms := mustReceive(t, pool, "q", "a", 10)
	if !slices.Equal(msgIDs(ms), []int64{id, other}) {
		t.Fatalf("a received %v, want [%d %d]", msgIDs(ms), id, other)
	}
	orig := ms[0]
	if orig.RetryCount != 0 || orig.PartitionKey == nil || *orig.PartitionKey != "tenant-7" {
		t.Fatalf("first delivery: %+v", orig)
	}
	nackAt := time.Now()
	if n := scalar[int32](t, pool, "select pgque.nack($1, $2, $3::interval, 'handler failed')",
		orig.BatchID, id, fmt.Sprintf("%d milliseconds", delay.Milliseconds())); n != 1 {
		t.Fatalf("nack = %d, want 1 (retried)", n)
	}
	if got := ack(t, pool, orig.BatchID); got != 1 {
		t.Fatalf("ack of the whole batch = %d, want 1", got)
	}
	if ci := getConsumerInfo(t, pool, "q", "a"); ci.RetryPending != 1 {
		t.Errorf("a has %d pending retries, want 1", ci.RetryPending)
	}
	// b has its own copy of the original events, unaffected by a's nack.
	if got := msgIDs(receiveAll(t, pool, "b", 10)); !slices.Equal(got, []int64{id, other}) {
		t.Fatalf("b received %v, want [%d %d]", got, id, other)
	}

	// Before the delay: maint_retry_events moves nothing, nothing arrives.
	// (On a slow machine the delay may pass during these rounds: what is
	// moved and received then counts towards the totals checked below.)
	var moved int32
	var got []message
	for range 2 {
		n := scalar[int32](t, pool, "select pgque.maint_retry_events()")
		if n != 0 && time.Since(nackAt) < delay {
			t.Fatalf("maint_retry_events moved %d events %v after nack with a %v delay", n, time.Since(nackAt), delay)
		}
		moved += n
		tick(t, pool, "q")
		early := receiveAll(t, pool, "a", 10)
		if len(early) != 0 && time.Since(nackAt) < delay {
			t.Fatalf("a received %v before the retry delay passed", msgIDs(early))
		}
		got = append(got, early...)
	}

	// Once the delay passed, maint_retry_events moves it, and not before.
	pgtest.WaitFor(t, 10*time.Second+delay, "maint_retry_events to move the retry", func() bool {
		n := scalar[int32](t, pool, "select pgque.maint_retry_events()")
		if n != 0 && time.Since(nackAt) < delay {
			t.Fatalf("maint_retry_events moved %d events %v after nack with a %v delay", n, time.Since(nackAt), delay)
		}
		moved += n
		return moved > 0
	})
	if moved != 1 {
		t.Fatalf("maint_retry_events moved %d events in all, want 1", moved)
	}
	tick(t, pool, "q")
	got = append(got, receiveAll(t, pool, "a", 10)...)
	if len(got) != 1 {
		t.Fatalf("a received %v after the delay, want the retried event %d once", msgIDs(got), id)
	}
	r := got[0]
	if r.MsgID != id || r.RetryCount != 1 || r.Type != orig.Type || r.Payload != orig.Payload ||
		r.PartitionKey == nil || *r.PartitionKey != "tenant-7" {
		t.Errorf("redelivered msg %d retry_count %d type %s payload %s key %s, want msg %d, retry_count 1, type %s, payload %s, key tenant-7",
			r.MsgID, r.RetryCount, r.Type, r.Payload, str(r.PartitionKey), id, orig.Type, orig.Payload)
	}
	if got := receiveAll(t, pool, "b", 10); len(got) != 0 {
		t.Errorf("b received %v: the retry copy belongs to a only", msgIDs(got))
	}
	if ci := getConsumerInfo(t, pool, "q", "a"); ci.RetryPending != 0 {
		t.Errorf("a still has %d pending retries", ci.RetryPending)
	}

	// The engine call: event_retry(batch, ev_id, seconds) behaves the same.
	eid := scalar[int64](t, pool, "select pgque.insert_event('q', 'raw', 'raw data', 'k-raw', 'x2', 'x3', 'x4')")
	tick(t, pool, "q")
	b := scalar[int64](t, pool, "select pgque.next_batch('q', 'a')")
	evs, err := batchEvents(pool, b)
	if err != nil || !slices.Equal(evIDs(evs), []int64{eid}) {
		t.Fatalf("batch %d: %v, %v", b, evIDs(evs), err)
	}
	if n := scalar[int32](t, pool, "select pgque.event_retry($1, $2, 0)", b, eid); n != 1 {
		t.Fatalf("event_retry = %d", n)
	}
	exec(t, pool, "select pgque.finish_batch($1)", b)
	receiveAll(t, pool, "b", 10)
	if n := scalar[int32](t, pool, "select pgque.maint_retry_events()"); n != 1 {
		t.Fatalf("maint_retry_events moved %d, want 1", n)
	}
	tick(t, pool, "q")
	batches := drainBatches(t, pool, "q", "a")
	var again []event
	for _, bb := range batches {
		again = append(again, bb...)
	}
	if len(again) != 1 {
		t.Fatalf("event_retry redelivered %v, want [%d]", evIDs(again), eid)
	}
	if e := again[0]; e.ID != eid || e.Retry == nil || *e.Retry != 1 || str(e.Extra1) != "k-raw" ||
		str(e.Extra2) != "x2" || str(e.Extra3) != "x3" || str(e.Extra4) != "x4" || e.data() != "raw data" {
		t.Errorf("event_retry redelivered ev %d retry %v extras %s/%s/%s/%s data %s, want ev %d with ev_retry 1, k-raw/x2/x3/x4, raw data",
			e.ID, retry(e.Retry), str(e.Extra1), str(e.Extra2), str(e.Extra3), str(e.Extra4), e.data(), eid)
	}
	for _, bb := range drainBatches(t, pool, "q", "b") {
		if len(bb) != 0 {
			t.Errorf("b saw a's event_retry copy: %v", evIDs(bb))
		}
	}
}

// TestDeadLetters: past max_retries a nacked event goes to the dead-letter
// table (dlq_list), dlq_replay puts it back and it is delivered again to that
// consumer only, dlq_purge removes dead letters.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	pool := setupAPI(t, "a", "b")
	exec(t, pool, "select pgque.set_queue_config('q', 'max_retries', '2')")
	id := scalar[int64](t, pool, `select pgque.send('q', 'job', '{"n": 1}'::jsonb, 'key-1')`)
	tick(t, pool, "q")
	if got := receiveAll(t, pool, "b", 10); len(got) != 1 {
		t.Fatalf("b received %v", msgIDs(got))
	}

	// failUntilDead nacks the event with zero delay until it is
	// dead-lettered, checking retry_count on each delivery.
	failUntilDead := func(reason string) {
		t.Helper()
		for want := int32(0); ; want++ {
			ms := mustReceive(t, pool, "q", "a", 10)
			if len(ms) != 1 || ms[0].MsgID != id || ms[0].RetryCount != want {
				t.Fatalf("delivery %d: %+v, want msg %d with retry_count %d", want, ms, id, want)
			}
			n := scalar[int32](t, pool, "select pgque.nack($1, $2, '0', $3)", ms[0].BatchID, id, reason)
			if ack(t, pool, ms[0].BatchID) != 1 {
				t.Fatal("ack did not finish the batch")
			}
			if want < 2 && n != 1 {
				t.Fatalf("nack at retry_count %d = %d, want 1 (retried; max_retries is 2)", want, n)
			}
			if want == 2 {
				if n != 0 {
					t.Fatalf("nack at retry_count 2 = %d, want 0 (dead-lettered)", n)
				}
				return
			}
			if m := scalar[int32](t, pool, "select pgque.maint_retry_events()"); m != 1 {
				t.Fatalf("maint_retry_events = %d, want 1", m)
			}
			tick(t, pool, "q")
		}
	}
	failUntilDead("boom")

	// Dead: not redelivered, listed in dlq_list with its fields.
	exec(t, pool, "select pgque.maint_retry_events()")
	tick(t, pool, "q")
	if got := receiveAll(t, pool, "a", 10); len(got) != 0 {
		t.Fatalf("a received %v after the event was dead-lettered", msgIDs(got))
	}
	type dl struct {
		DLID     int64
		Consumer string
		Reason   *string
		EvID     int64
		Retry    int32
		Type     *string
		Data     *string
		Extra1   *string
	}
	list := func() []dl {
		var out []dl
		rows, err := pool.Query(context.Background(),
			"select dl_id, consumer, reason, ev_id, ev_retry, ev_type, ev_data, ev_extra1 from pgque.dlq_list('q')")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var d dl
			if err := rows.Scan(&d.DLID, &d.Consumer, &d.Reason, &d.EvID, &d.Retry, &d.Type, &d.Data, &d.Extra1); err != nil {
				t.Fatal(err)
			}
			out = append(out, d)
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return out
	}
	dls := list()
	if len(dls) != 1 {
		t.Fatalf("dlq_list = %+v, want one dead letter", dls)
	}
	d := dls[0]
	if d.Consumer != "a" || d.EvID != id || d.Retry != 2 || d.Reason == nil || *d.Reason != "boom" ||
		d.Type == nil || *d.Type != "job" || d.Data == nil || *d.Data != `{"n": 1}` || d.Extra1 == nil || *d.Extra1 != "key-1" {
		t.Errorf("dead letter = %+v", d)
	}
	if n := len(column[int64](t, pool, "select dl_id from pgque.dlq_list('q', 'b')")); n != 0 {
		t.Errorf("dlq_list(q, b) has %d rows, want 0", n)
	}

	// Replay: back in the queue for a only, marked, its retry count kept.
	if got := scalar[int64](t, pool, "select pgque.dlq_replay('q', $1)", d.DLID); got != id {
		t.Fatalf("dlq_replay = %d, want %d", got, id)
	}
	if n := len(list()); n != 0 {
		t.Errorf("dlq_list has %d rows after replay, want 0", n)
	}
	tick(t, pool, "q")
	if got := receiveAll(t, pool, "b", 10); len(got) != 0 {
		t.Errorf("b received the replayed event: %v", msgIDs(got))
	}
	// It is delivered once more, marked (retry_count -1 - 2), and, its
	// retries spent, dies again at its first failure.
	ms := mustReceive(t, pool, "q", "a", 10)
	if len(ms) != 1 || ms[0].MsgID != id || ms[0].RetryCount != -3 {
		t.Fatalf("the replay: %+v, want msg %d with retry_count -3", ms, id)
	}
	if n := scalar[int32](t, pool, "select pgque.nack($1, $2, '0', 'boom again')", ms[0].BatchID, id); n != 0 {
		t.Fatalf("nack of the replay = %d, want 0 (dead-lettered)", n)
	}
	ack(t, pool, ms[0].BatchID)
	dls = list()
	if len(dls) != 1 || dls[0].EvID != id || *dls[0].Reason != "boom again" || dls[0].Retry != 2 {
		t.Fatalf("dlq_list after the second death = %+v", dls)
	}
	wantCode(t, "dlq_replay of a replayed dead letter", queryErr(pool, "select pgque.dlq_replay('q', $1)", d.DLID),
		"PQ040", fmt.Sprint(d.DLID))

	// Purge: only the consumer named, then everything.
	if n := scalar[int64](t, pool, "select pgque.dlq_purge('q', 'b')"); n != 0 {
		t.Errorf("dlq_purge(q, b) = %d, want 0", n)
	}
	if n := scalar[int64](t, pool, "select pgque.dlq_purge('q', 'a', '1 hour')"); n != 0 {
		t.Errorf("dlq_purge of dead letters older than an hour = %d, want 0", n)
	}
	if n := scalar[int64](t, pool, "select pgque.dlq_purge('q')"); n != 1 {
		t.Errorf("dlq_purge = %d, want 1", n)
	}
	if n := len(list()); n != 0 {
		t.Errorf("dlq_list has %d rows after purge", n)
	}
	if n := scalar[int64](t, pool, "select dead_letters from pgque.get_queue_info('q')"); n != 0 {
		t.Errorf("get_queue_info reports %d dead letters after purge", n)
	}
}

// TestChunkedDelivery: receive with max smaller than the batch hands out
// chunks; receiving again without ack returns the same rows; ack returns 0
// while rows remain and the next receive returns the next chunk; the ack of
// the last chunk returns 1. Nothing is lost or duplicated.
func TestChunkedDelivery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		events, max int
	}{
		{10, 3}, // last chunk short
		{9, 3},  // last chunk full: ack must look ahead
		{5, 5},  // one full chunk
		{4, 1},
	} {
		t.Run(fmt.Sprintf("%d_by_%d", tc.events, tc.max), func(t *testing.T) {
			t.Parallel()
			pool := setupAPI(t, "c")
			sent := sendN(t, pool, tc.events, "chunk")
			tick(t, pool, "q")
			var got []int64
			var batch int64
			chunks := (tc.events + tc.max - 1) / tc.max
			for i := range chunks {
				first := mustReceive(t, pool, "q", "c", tc.max)
				again := mustReceive(t, pool, "q", "c", tc.max)
				if !slices.Equal(msgIDs(first), msgIDs(again)) || len(again) == 0 || first[0].BatchID != again[0].BatchID {
					t.Fatalf("chunk %d: receive returned %v, then %v without ack; want the same rows", i, msgIDs(first), msgIDs(again))
				}
				want := sent[i*tc.max : min((i+1)*tc.max, tc.events)]
				if !slices.Equal(msgIDs(first), want) {
					t.Fatalf("chunk %d = %v, want %v", i, msgIDs(first), want)
				}
				if i == 0 {
					batch = first[0].BatchID
				} else if first[0].BatchID != batch {
					t.Fatalf("chunk %d comes from batch %d, want %d", i, first[0].BatchID, batch)
				}
				got = append(got, msgIDs(first)...)
				last := i == chunks-1
				if a := ack(t, pool, batch); a != map[bool]int32{false: 0, true: 1}[last] {
					t.Fatalf("ack of chunk %d/%d = %d", i+1, chunks, a)
				}
				if ci := getConsumerInfo(t, pool, "q", "c"); (ci.CurrentBatch == 0) != last {
					t.Fatalf("after ack of chunk %d/%d the open batch is %v", i+1, chunks, ci.CurrentBatch)
				}
			}
			if !slices.Equal(got, sent) {
				t.Errorf("received %v, want %v", got, sent)
			}
			if ms := mustReceive(t, pool, "q", "c", tc.max); len(ms) != 0 {
				t.Errorf("receive after the last ack returned %v", msgIDs(ms))
			}
			wantCode(t, "ack of a finished batch", queryErr(pool, "select pgque.ack($1)", batch), "PQ020", fmt.Sprint(batch))
		})
	}
}

// TestAckNeverSkipsUnreceivedRows: ack never finishes a batch past rows
// nobody received: an ack with nothing received, or a second ack after one
// receive, acknowledges nothing more.
func TestAckNeverSkipsUnreceivedRows(t *testing.T) {
	t.Parallel()
	pool := setupAPI(t, "c")
	sent := sendN(t, pool, 7, "skip")
	tick(t, pool, "q")

	// The batch is open (next_batch) but nothing was received yet.
	b := scalar[int64](t, pool, "select pgque.next_batch('q', 'c')")
	if a := ack(t, pool, b); a != 0 {
		t.Fatalf("ack before any receive = %d, want 0", a)
	}
	if ci := getConsumerInfo(t, pool, "q", "c"); ci.CurrentBatch != b {
		t.Fatalf("ack before any receive closed batch %d: open batch now %v", b, ci.CurrentBatch)
	}
	ms := mustReceive(t, pool, "q", "c", 3)
	if !slices.Equal(msgIDs(ms), sent[:3]) || ms[0].BatchID != b {
		t.Fatalf("first chunk = %v of batch %d, want %v of %d", msgIDs(ms), ms[0].BatchID, sent[:3], b)
	}
	if a := ack(t, pool, b); a != 0 {
		t.Fatalf("ack of chunk 1 = %d", a)
	}
	// A second ack with no receive in between acknowledges nothing.
	for range 2 {
		if a := ack(t, pool, b); a != 0 {
			t.Fatalf("repeated ack = %d, want 0", a)
		}
	}
	ms = mustReceive(t, pool, "q", "c", 3)
	if !slices.Equal(msgIDs(ms), sent[3:6]) {
		t.Fatalf("chunk after repeated acks = %v, want %v (nothing skipped)", msgIDs(ms), sent[3:6])
	}
	// A receive with a larger max widens the chunk; the ack covers it all.
	ms = mustReceive(t, pool, "q", "c", 100)
	if !slices.Equal(msgIDs(ms), sent[3:]) {
		t.Fatalf("re-receive with max 100 = %v, want %v", msgIDs(ms), sent[3:])
	}
	if a := ack(t, pool, b); a != 1 {
		t.Fatalf("ack of the last chunk = %d, want 1", a)
	}
}

// TestReplayRetriesStayMarked: an event dead-lettered at once (a nack with
// a NULL delay, no retry spent) and replayed keeps its retries: each
// redelivery of the replay is still marked (retry_count -1 - n), and past
// max_retries it dies with its count.
func TestReplayRetriesStayMarked(t *testing.T) {
	t.Parallel()
	pool := setupAPI(t, "a")
	exec(t, pool, "select pgque.set_queue_config('q', 'max_retries', '2')")
	id := scalar[int64](t, pool, `select pgque.send('q', 'job', '{"n": 1}'::jsonb, 'key-1')`)
	tick(t, pool, "q")
	ms := mustReceive(t, pool, "q", "a", 10)
	if len(ms) != 1 || scalar[int32](t, pool, "select pgque.nack($1, $2, null, 'fatal')", ms[0].BatchID, id) != 0 {
		t.Fatalf("dead-lettering %v at once failed", ms)
	}
	ack(t, pool, ms[0].BatchID)
	dl := scalar[int64](t, pool, "select dl_id from pgque.dlq_list('q')")
	exec(t, pool, "select pgque.dlq_replay('q', $1)", dl)
	tick(t, pool, "q")
	for want := int32(-1); ; want-- {
		ms := mustReceive(t, pool, "q", "a", 10)
		if len(ms) != 1 || ms[0].MsgID != id || ms[0].RetryCount != want {
			t.Fatalf("delivery of the replay: %+v, want msg %d with retry_count %d", ms, id, want)
		}
		n := scalar[int32](t, pool, "select pgque.nack($1, $2, '0', 'again')", ms[0].BatchID, id)
		ack(t, pool, ms[0].BatchID)
		if want == -3 {
			if n != 0 {
				t.Fatalf("nack at retry_count %d = %d, want 0 (dead-lettered)", want, n)
			}
			break
		}
		if n != 1 {
			t.Fatalf("nack at retry_count %d = %d, want 1 (retried)", want, n)
		}
		exec(t, pool, "select pgque.maint_retry_events()")
		tick(t, pool, "q")
	}
	if r := scalar[int32](t, pool, "select ev_retry from pgque.dlq_list('q')"); r != 2 {
		t.Fatalf("dead again with ev_retry %d, want 2", r)
	}
}

// TestReplayReportAfterRotation: once rotation has dropped the table that
// held a dead letter's event, its replay cannot count the later events of
// its key, and says so (history_complete false); before, it says the
// history is complete.
func TestReplayReportAfterRotation(t *testing.T) {
	t.Parallel()
	pool := setupAPI(t, "a")
	exec(t, pool, "select pgque.set_queue_config('q', 'rotation_period', '1 ms')")
	deadLetter := func() int64 {
		t.Helper()
		id := scalar[int64](t, pool, `select pgque.send('q', 'job', '{}'::jsonb, 'k')`)
		tick(t, pool, "q")
		ms := mustReceive(t, pool, "q", "a", 10)
		if len(ms) != 1 || scalar[int32](t, pool, "select pgque.nack($1, $2, null, 'fatal')", ms[0].BatchID, id) != 0 {
			t.Fatalf("dead-lettering %v at once failed", ms)
		}
		ack(t, pool, ms[0].BatchID)
		return scalar[int64](t, pool, "select dl_id from pgque.dlq_list('q') where ev_id = $1", id)
	}
	report := func(dl int64) (complete bool) {
		t.Helper()
		return scalar[bool](t, pool, "select history_complete from pgque.dlq_replay_report('q', $1)", dl)
	}
	old := deadLetter()
	for range 10 {
		if scalar[int64](t, pool, "select count(*) from pgque.event e join pgque.dead_letter d using (ev_id) where d.dl_id = $1 and e.ev_owner is null", old) == 0 {
			break
		}
		tick(t, pool, "q")
		receiveAll(t, pool, "a", 10)
		maintRotate(t, pool)
	}
	if !report(deadLetter()) {
		t.Error("replay of a dead letter whose event is still held: history_complete false, want true")
	}
	if report(old) {
		t.Error("replay of a dead letter whose event was rotated away: history_complete true, want false")
	}
}
