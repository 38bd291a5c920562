package partitiontest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// stateRecords counts the sub_state records of a plain subscription.
func stateRecords(t *testing.T, d *db, queue, consumer string) int64 {
	t.Helper()
	return one[int64](t, d.pool, `select count(*) from pgque.sub_state st
		join pgque.subscription s on s.sub_id = st.st_sub join pgque.queue q on q.queue_id = s.sub_queue
		where q.queue_name = $1 and s.sub_name = $2`, queue, consumer)
}

// T-receive-raw: receive_raw hands out the same chunks as receive (same
// events, same cuts, same order) with the payload as stored, and its
// acknowledgement (ack_batch) does what ack does: a consumer draining with
// receive_raw(..., ack_batch) one call per chunk sees exactly the chunks a
// consumer draining with receive + ack sees, over ticks smaller, equal to
// and larger than the chunk, an event only insert_event could store, and
// retried events. Each receive_raw call appends at most one state record;
// a redelivery and an empty poll append none.
func TestReceiveRawMatchesReceive(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'a')")
	d.exec("select pgque.subscribe('q', 'b')")
	stored := map[int64]string{}
	for _, n := range []int{3, 5, 12, 1, 0, 7} {
		for i := range n {
			data := fmt.Sprintf(`{"n": %d, "i": %d}`, n, i)
			id := one[int64](t, d.pool, "select pgque.send('q', 't', $1::jsonb)", data)
			stored[id] = one[string](t, d.pool, "select ev_data from pgque.event where ev_id = $1", id)
		}
		if n == 12 {
			id := one[int64](t, d.pool, "select pgque.insert_event('q', 't', 'not json', null, null, null, null)")
			stored[id] = "not json"
		}
		d.tick("q")
	}
	const max = 5
	ctx := context.Background()

	// a: receive + ack.
	var chunksA [][]int64
	for range 100 {
		got := receiveText(t, d.pool, "select msg_id, batch_id, payload::text from pgque.receive('q', 'a', $1)", max)
		if len(got) == 0 {
			break
		}
		chunksA = append(chunksA, receivedIDs(got))
		d.exec("select pgque.ack($1)", got[0].Batch)
	}

	// b: receive_raw with the previous chunk's acknowledgement.
	var chunksB [][]int64
	var ackBatch *int64
	for range 100 {
		before := stateRecords(t, d, "q", "b")
		got := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', $1, $2)", max, ackBatch)
		if n := stateRecords(t, d, "q", "b") - before; n > 1 {
			t.Fatalf("receive_raw appended %d state records, want at most 1", n)
		}
		if len(got) == 0 {
			break
		}
		for _, r := range got {
			if r.Payload == nil || *r.Payload != stored[r.ID] {
				t.Fatalf("receive_raw payload of event %d = %v, want the stored %q", r.ID, r.Payload, stored[r.ID])
			}
		}
		// Redelivery: the same chunk, and nothing written.
		before = stateRecords(t, d, "q", "b")
		again := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', $1)", max)
		if fmt.Sprint(receivedIDs(again)) != fmt.Sprint(receivedIDs(got)) || again[0].Batch != got[0].Batch {
			t.Fatalf("receive_raw redelivered %v of batch %d, want %v of batch %d", receivedIDs(again), again[0].Batch, receivedIDs(got), got[0].Batch)
		}
		if n := stateRecords(t, d, "q", "b") - before; n != 0 {
			t.Fatalf("a redelivery appended %d state records", n)
		}
		chunksB = append(chunksB, receivedIDs(got))
		b := got[0].Batch
		ackBatch = &b
	}
	if len(chunksA) == 0 || fmt.Sprint(chunksA) != fmt.Sprint(chunksB) {
		t.Fatalf("receive + ack saw chunks %v, receive_raw with ack_batch saw %v", chunksA, chunksB)
	}
	// Everything was acknowledged: an empty poll writes nothing and both
	// consumers are at the same position.
	before := stateRecords(t, d, "q", "b")
	if got := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', 10)"); len(got) != 0 {
		t.Fatalf("receive_raw after the drain returned %d rows", len(got))
	}
	if n := stateRecords(t, d, "q", "b") - before; n != 0 {
		t.Fatalf("an empty poll appended %d state records", n)
	}
	la := one[int64](t, d.pool, "select last_tick from pgque.get_consumer_info('q', 'a')")
	lb := one[int64](t, d.pool, "select last_tick from pgque.get_consumer_info('q', 'b')")
	if la != lb {
		t.Fatalf("after the drain a is at tick %d, b at tick %d", la, lb)
	}

	// Retried events come back through receive_raw too.
	id := d.send("q", nil)
	d.tick("q")
	got := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', 10)")
	if len(got) != 1 || got[0].ID != id {
		t.Fatalf("receive_raw returned %v, want event %d", receivedIDs(got), id)
	}
	if one[int32](t, d.pool, "select pgque.nack($1, $2, '0 s', 'again')", got[0].Batch, id) != 1 {
		t.Fatal("nack did not retry")
	}
	b := got[0].Batch
	if rest := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', 10, $1)", b); len(rest) != 0 {
		t.Fatalf("after the ack receive_raw returned %v before the retry was due", receivedIDs(rest))
	}
	if _, err := d.pool.Exec(ctx, "select pgque.maint_retry_events()"); err != nil {
		t.Fatal(err)
	}
	d.tick("q")
	retried := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', 10)")
	if len(retried) != 1 || retried[0].ID != id {
		t.Fatalf("the retried event came back as %v, want %d", receivedIDs(retried), id)
	}
}

// T-receive-raw-ack: receive_raw's acknowledgement names the batch it
// acknowledges; a batch that is not the consumer's open one (another
// consumer's, a finished one, nonsense) is PQ020, and nothing is
// acknowledged: the chunk is redelivered.
func TestReceiveRawAckChecksTheBatch(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	d.exec("select pgque.subscribe('q', 'a')")
	d.exec("select pgque.subscribe('q', 'b')")
	for range 3 {
		d.send("q", nil)
	}
	d.tick("q")
	ctx := context.Background()
	ga := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'a', 2)")
	gb := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'b', 2)")
	if len(ga) != 2 || len(gb) != 2 {
		t.Fatalf("received %d and %d rows, want 2 and 2", len(ga), len(gb))
	}
	for _, bad := range []int64{gb[0].Batch, -1, ga[0].Batch + 1048576} {
		_, err := d.pool.Exec(ctx, "select * from pgque.receive_raw('q', 'a', 2, $1)", bad)
		wantState(t, err, "PQ020", fmt.Sprintf("receive_raw acknowledging batch %d", bad))
	}
	again := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'a', 2)")
	if fmt.Sprint(receivedIDs(again)) != fmt.Sprint(receivedIDs(ga)) {
		t.Fatalf("after refused acknowledgements a received %v, want its chunk %v again", receivedIDs(again), receivedIDs(ga))
	}
	// The right batch moves on to the rest of it, and then finishes it.
	rest := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'a', 2, $1)", ga[0].Batch)
	if len(rest) != 1 || rest[0].ID <= ga[1].ID || rest[0].Batch != ga[0].Batch {
		t.Fatalf("after acknowledging a received %v, want the batch's last event", receivedIDs(rest))
	}
	if got := receiveText(t, d.pool, "select msg_id, batch_id, payload from pgque.receive_raw('q', 'a', 2, $1)", ga[0].Batch); len(got) != 0 {
		t.Fatalf("after the last acknowledgement a received %v", receivedIDs(got))
	}
	if one[*int64](t, d.pool, "select current_batch from pgque.get_consumer_info('q', 'a')") != nil {
		t.Fatal("the batch is still open after its last chunk was acknowledged")
	}
	_, err := d.pool.Exec(ctx, "select * from pgque.receive_raw('q', 'a', 2, $1)", ga[0].Batch)
	wantState(t, err, "PQ020", "receive_raw acknowledging a finished batch")
}

func receivedIDs(rs []received) []int64 {
	out := make([]int64, len(rs))
	for i, r := range rs {
		out[i] = r.ID
	}
	return out
}

// T-receive-partitioned-raw: receive_partitioned_raw hands out the chunks
// receive_partitioned does, slot by slot (the same events, in the same
// chunks, with the same epochs), with each payload as stored, and the
// fenced acknowledgement settles them the same way. Data that is not JSON
// (insert_event) comes back as stored, where the jsonb form makes it a
// JSON string.
func TestReceivePartitionedRawMatches(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	const n = 2
	d.subscribeSlots("q", "a", n)
	d.subscribeSlots("q", "b", n)
	stored := map[int64]string{}
	for round := range 4 {
		for i := range 7 {
			key := fmt.Sprintf("k%d", i%5)
			// Sent as text: stored as given, spaces and key order included.
			data := fmt.Sprintf(`{ "z": %d,  "a": [%d] }`, round, i)
			id := one[int64](t, d.pool, "select pgque.send('q', 't', $1::text, $2)", data, key)
			stored[id] = data
		}
		if round == 2 {
			id := one[int64](t, d.pool, "select pgque.insert_event('q', 't', 'not json', 'k1', null, null, null)")
			stored[id] = "not json"
		}
		d.tick("q")
	}
	ctx := context.Background()
	type row struct {
		id, batch, epoch int64
		payload          string
	}
	read := func(sql string, args ...any) []row {
		t.Helper()
		rows, err := d.pool.Query(ctx, sql, args...)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.batch, &x.epoch, &x.payload)
			return x, err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	seen := 0
	refsA, refsB := d.claimAll("q", "a", n, "w", 3), d.claimAll("q", "b", n, "w", 3)
	for slot := range n {
		sa, sb := refsA[slot], refsB[slot]
		for range 100 {
			ta := tokenFor(t, d.pool, "q", "a", slot, "w")
			tb := tokenFor(t, d.pool, "q", "b", slot, "w")
			ja := read(`select msg_id, batch_id, epoch, payload::text from pgque.receive_partitioned('q', 'a', $1, $2, 'w', $3::uuid, 3)`, slot, n, ta)
			rb := read(`select msg_id, batch_id, epoch, payload from pgque.receive_partitioned_raw('q', 'b', $1, $2, 'w', $3::uuid, 3)`, slot, n, tb)
			if len(ja) != len(rb) {
				t.Fatalf("slot %d: receive_partitioned gave %d rows, receive_partitioned_raw %d", slot, len(ja), len(rb))
			}
			if len(ja) == 0 {
				break
			}
			for i := range ja {
				a, b := ja[i], rb[i]
				if a.id != b.id || a.epoch != b.epoch {
					t.Fatalf("slot %d row %d: jsonb form %+v, raw form %+v", slot, i, a, b)
				}
				if b.payload != stored[b.id] {
					t.Fatalf("raw payload of event %d = %q, want the stored %q", b.id, b.payload, stored[b.id])
				}
				want := one[string](t, d.pool, "select coalesce(pgque._payload($1), 'null')::text", stored[b.id])
				if a.payload != want {
					t.Fatalf("jsonb payload of event %d = %q, want %q", a.id, a.payload, want)
				}
				seen++
			}
			for _, s := range []struct {
				ref slotRef
				tok *string
				r   row
			}{{sa, ta, ja[0]}, {sb, tb, rb[0]}} {
				if one[int32](t, d.pool, "select pgque.ack_partitioned($1, $2, $3, $4, $5, $6::uuid, $7, $8, $9)",
					"q", s.ref.c, slot, n, "w", s.tok, s.r.epoch, s.r.batch, s.r.id) < 0 {
					t.Fatal("ack_partitioned returned a negative count")
				}
			}
		}
	}
	if seen != len(stored) {
		t.Fatalf("the two forms agreed on %d events, want all %d", seen, len(stored))
	}
}

// T-receive-partitioned-raw-ack: receive_partitioned_raw with the proof of
// the chunk the slot handed out last acknowledges it first, as
// ack_partitioned would, and then receives: a slot draining with one call
// per chunk sees exactly the chunks of a slot draining with receive +
// ack_partitioned, over ticks smaller and larger than the chunk. A wrong
// proof is refused (PQ032 for another epoch, PQ035 for an event outside
// the chunk, 22004 for a partial proof) and a call that fails after the
// acknowledgement (a bad max) acknowledges nothing: the same proof then
// still acknowledges the chunk.
func TestReceivePartitionedRawAcks(t *testing.T) {
	t.Parallel()
	d := setup(t)
	d.createQueue("q")
	const n = 2
	d.subscribeSlots("q", "a", n)
	d.subscribeSlots("q", "b", n)
	for _, count := range []int{2, 9, 1, 14, 5} {
		for i := range count {
			d.send("q", ptr(fmt.Sprintf("k%d", i%6)))
		}
		d.tick("q")
	}
	ctx := context.Background()
	type row struct{ id, batch, epoch int64 }
	read := func(sql string, args ...any) ([]row, error) {
		rows, err := d.pool.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.batch, &x.epoch)
			return x, err
		})
	}
	const recv = `select msg_id, batch_id, epoch from pgque.receive_partitioned_raw('q', $1, $2, $3, 'w', $4::uuid, $5, $6, $7, $8)`
	d.claimAll("q", "a", n, "w", 3)
	d.claimAll("q", "b", n, "w", 3)
	total := 0
	for slot := range n {
		ta := tokenFor(t, d.pool, "q", "a", slot, "w")
		tb := tokenFor(t, d.pool, "q", "b", slot, "w")
		var last *row // b's chunk not acknowledged yet
		for chunk := 0; ; chunk++ {
			ra, err := read(recv, "a", slot, n, ta, 3, nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var pe, pb, pm *int64
			if last != nil {
				pe, pb, pm = &last.epoch, &last.batch, &last.id
				if chunk == 1 {
					// Wrong proofs, each refused before anything is read.
					other := last.epoch + 1
					_, err := read(recv, "b", slot, n, tb, 3, &other, pb, pm)
					wantState(t, err, "PQ032", "an ack under another epoch")
					outside := last.id - 1_000_000
					_, err = read(recv, "b", slot, n, tb, 3, pe, pb, &outside)
					wantState(t, err, "PQ035", "an ack naming an event outside the chunk")
					_, err = read(recv, "b", slot, n, tb, 3, pe, pb, nil)
					wantState(t, err, "22004", "a partial proof")
					_, err = read(recv, "b", slot, n, tb, 0, pe, pb, pm)
					wantState(t, err, "PQ011", "an ack with a bad max")
				}
			}
			rb, err := read(recv, "b", slot, n, tb, 3, pe, pb, pm)
			if err != nil {
				t.Fatalf("slot %d chunk %d: %v", slot, chunk, err)
			}
			if len(ra) != len(rb) {
				t.Fatalf("slot %d chunk %d: separate ack gave %d rows, ack in the receive %d", slot, chunk, len(ra), len(rb))
			}
			for i := range ra {
				if ra[i].id != rb[i].id {
					t.Fatalf("slot %d chunk %d row %d: event %d, with the ack in the receive %d", slot, chunk, i, ra[i].id, rb[i].id)
				}
			}
			if len(ra) == 0 {
				break
			}
			total += len(ra)
			if one[int32](t, d.pool, "select pgque.ack_partitioned('q', 'a', $1, $2, 'w', $3::uuid, $4, $5, $6)",
				slot, n, ta, ra[0].epoch, ra[0].batch, ra[0].id) < 0 {
				t.Fatal("ack_partitioned returned a negative count")
			}
			last = &rb[0]
		}
		// The empty receive acknowledged b's last chunk: its own ack now
		// names a chunk that is settled.
		_, err := read(`select pgque.ack_partitioned('q', 'b', $1, $2, 'w', $3::uuid, $4, $5, $6)`, slot, n, tb, last.epoch, last.batch, last.id)
		wantOneOf(t, err, "acknowledging b's last chunk again", "PQ020", "PQ035")
	}
	if total != 31 {
		t.Fatalf("drained %d events, want 31", total)
	}
	for _, c := range []string{"a", "b"} {
		for slot := range n {
			if !caughtUp(t, d.pool, slotRef{q: "q", c: c, slot: slot, n: n}) {
				t.Fatalf("%s slot %d is not caught up", c, slot)
			}
		}
	}
}
