package bench

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// WAL per keyed send: every record a send writes, read back with
// pg_walinspect (PostgreSQL 15+). A queue with a 16-slot consumer (so its
// event tables carry the routing index) takes keyed sends, each in its own
// transaction; the records of that transaction (its xid) are grouped by
// resource manager, record type and the relation they touch, and averaged
// over the repetitions, so the occasional index page split or full-page
// image counts at its real rate. The same for a send with a dedup key and
// for a send_batch of 100 keyed events. The event row's columns and their
// stored sizes are printed with it. Without pg_walinspect (PostgreSQL 14)
// only the WAL position's advance per event is reported.

func init() {
	register(&suite{
		name:  "wal",
		about: "WAL records and bytes of one keyed send, one with a dedup key and a batch of 100, by record and relation (pg_walinspect)",
		run:   runWAL,
	})
}

// walRecord is the records of one kind a case wrote, per send.
type walRecord struct {
	rmgr, kind, rel string
	count           float64 // records per send
	bytes           float64 // record_length per send (FPI included)
	fpi             float64 // full-page image bytes per send
}

// walCase is one measured kind of send.
type walCase struct {
	name     string
	about    string
	events   int // events per transaction
	dedup    bool
	upstream bool // upstream PgQue's keyed send
}

func runWAL(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgque(ctx, e, "bench_wal", 4)
	if err != nil {
		return err
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	c := conn.Conn()
	const slots = 16
	inspect, err := walSetup(ctx, e, c, slots)
	if err != nil {
		return err
	}
	reps := pick(e, 50, 200)
	cases := []walCase{
		{name: "send", about: "pgque.send with a partition key", events: 1},
		{name: "send_dedup", about: "pgque.send with a partition key and a dedup key", events: 1, dedup: true},
		{name: "batch100", about: "pgque.send_batch of 100 events with partition keys, per event", events: 100},
	}
	seq := 0
	var sendTotal, sendAdvance float64
	for _, wc := range cases {
		// Warm up: the pages the sends touch exist and were written since
		// the last checkpoint, as in a queue that is in use.
		for range 20 {
			if _, err := walSend(ctx, c, wc, &seq); err != nil {
				return err
			}
		}
		recs, advance, err := walMeasure(ctx, c, wc, reps, &seq, inspect)
		if err != nil {
			return fmt.Errorf("%s: %w", wc.name, err)
		}
		if wc.name == "send" {
			sendTotal, sendAdvance = walReport(e, r, wc, recs, advance, reps, inspect), advance
		} else {
			walReport(e, r, wc, recs, advance, reps, inspect)
		}
	}
	if err := walRowWidth(ctx, e, r, c); err != nil {
		return err
	}
	if err := walConsume(ctx, e, r, c, slots, pick(e, 20, 100), inspect); err != nil {
		return err
	}
	if e.upstream == nil {
		return nil
	}
	return walUpstream(ctx, e, r, slots, reps, inspect, sendTotal, sendAdvance)
}

// walSetup creates pg_walinspect in c's database and subscribes a
// consumer "c" of slots slots to queue bench (pgque's or upstream's, whose
// subscribe_slot has the same form). Without pg_walinspect (PostgreSQL 14,
// a build without contrib, a role that may not create it) it returns false:
// only the WAL position's advance is measured.
func walSetup(ctx context.Context, e *env, c *pgx.Conn, slots int) (bool, error) {
	inspect := true
	if _, err := c.Exec(ctx, "create extension if not exists pg_walinspect"); err != nil {
		inspect = false
		e.logf("   no breakdown by record: pg_walinspect (PostgreSQL 15+ contrib) could not be created: %v", err)
	}
	for k := range slots {
		if _, err := c.Exec(ctx, "select pgque.subscribe_slot($1, 'c', $2, $3)", pgqueQueue, k, slots); err != nil {
			return false, fmt.Errorf("subscribe_slot: %w", err)
		}
	}
	return inspect, routeIndexes(ctx, c)
}

// walReport prints and records the records of case wc and returns their
// bytes per event (0 without inspect).
func walReport(e *env, r *recorder, wc walCase, recs []walRecord, advance float64, reps int, inspect bool) float64 {
	var total, fpi float64
	e.logf("   %s (%s), mean of %d transactions:", wc.name, wc.about, reps)
	if !inspect {
		e.logf("   WAL position advance: %.1f bytes/event", advance)
		r.add(wc.name+"_lsn_advance", single(advance), "bytes/event", nil, "pg_current_wal_insert_lsn advance; no breakdown without pg_walinspect")
		return 0
	}
	e.logf("   | record | relation | records/event | bytes/event | of which FPI |")
	e.logf("   | --- | --- | ---: | ---: | ---: |")
	for _, rec := range recs {
		total += rec.bytes
		fpi += rec.fpi
		e.logf("   | %s/%s | %s | %.2f | %.1f | %.1f |", rec.rmgr, rec.kind, rec.rel, rec.count, rec.bytes, rec.fpi)
		if rec.bytes > 0 {
			r.add(walCaseName(wc.name, rec), single(rec.bytes), "bytes/event", nil, fmt.Sprintf("%.2f records/event", rec.count))
		}
	}
	e.logf("   | total | | | %.1f | %.1f |", total, fpi)
	e.logf("   WAL position advance: %.1f bytes/event (records aligned to 8 bytes, page headers)", advance)
	r.add(wc.name+"_lsn_advance", single(advance), "bytes/event", nil, "pg_current_wal_insert_lsn advance over the same transactions: the records with their alignment and page headers")
	r.add(wc.name+"_total", single(total), "bytes/event", nil,
		fmt.Sprintf("%s; mean of %d transactions, full-page images %.1f bytes/event", wc.about, reps, fpi))
	return total
}

// walUpstream measures upstream PgQue's keyed send the same way, in
// database bench_wal_upstream (a queue with a 16-slot consumer, each send
// in its own transaction), and compares it with pgque's.
func walUpstream(ctx context.Context, e *env, r *recorder, slots, reps int, inspect bool, pgqueTotal, pgqueAdvance float64) error {
	e.logf("   upstream PgQue from %s", e.upstream.describe())
	u, err := newUpstream(ctx, e, "bench_wal_upstream", 2)
	if err != nil {
		return err
	}
	conn, err := u.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	c := conn.Conn()
	if _, err := c.Exec(ctx, "select pgque.create_queue($1)", pgqueQueue); err != nil {
		return fmt.Errorf("upstream create_queue: %w", err)
	}
	if inspect, err = walSetup(ctx, e, c, slots); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	wc := walCase{name: "upstream_send", about: "upstream's pgque.send(queue, type, payload jsonb, partition key)", events: 1, upstream: true}
	seq := 0
	for range 20 {
		if _, err := walSend(ctx, c, wc, &seq); err != nil {
			return err
		}
	}
	recs, advance, err := walMeasure(ctx, c, wc, reps, &seq, inspect)
	if err != nil {
		return fmt.Errorf("%s: %w", wc.name, err)
	}
	total := walReport(e, r, wc, recs, advance, reps, inspect)
	e.logf("   | WAL per keyed send | pgque | upstream | pgque / upstream |")
	e.logf("   | --- | ---: | ---: | ---: |")
	if inspect {
		e.logf("   | records (pg_walinspect) | %.1f | %.1f | %.2f× |", pgqueTotal, total, pgqueTotal/total)
		r.compare("send_total_vs_upstream", single(pgqueTotal), "upstream_send_total", single(total), "bytes/event", nil, "")
	}
	e.logf("   | WAL position advance | %.1f | %.1f | %.2f× |", pgqueAdvance, advance, pgqueAdvance/advance)
	// The target of docs/benchmarks.md, "WAL per keyed send": at most a
	// tenth more than upstream's, which has no routing index.
	r.compare("send_lsn_advance_vs_upstream", single(pgqueAdvance), "upstream_send_lsn_advance", single(advance), "bytes/event",
		valueAtMostRatio(1.1), "")
	return nil
}

// walConsume measures the WAL of a tick holding one keyed event and of the
// calls a 16-slot consumer makes for it, each slot calling
// receive_partitioned_raw once as the tick's notification wakes it: the
// touched slot's call (opens the batch, hands out the chunk), its next call
// with the chunk's acknowledgement folded in (finds nothing more), and each
// untouched slot's call (opens the batch, finds nothing for the slot,
// finishes it).
func walConsume(ctx context.Context, e *env, r *recorder, c *pgx.Conn, slots, reps int, inspect bool) error {
	tokens := make([]string, slots)
	for k := range slots {
		var token *string
		if err := c.QueryRow(ctx, "select token::text from pgque.claim_slot($1, 'c', $2, 'wal', '10 minutes')", pgqueQueue, k).Scan(&token); err != nil {
			return fmt.Errorf("claim_slot %d: %w", k, err)
		}
		if token == nil {
			return fmt.Errorf("claim_slot %d: held by another worker", k)
		}
		tokens[k] = *token
	}
	acks := make([][3]*int64, slots)
	// receive runs one call for slot k in a transaction of its own and
	// returns the rows it got and its xid (0 when it wrote nothing).
	receive := func(k int) (int, int64, error) {
		got := 0
		var xid *int64
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `select msg_id, batch_id, epoch from pgque.receive_partitioned_raw($1, 'c', $2, $3, 'wal', $4::uuid, 100, $5, $6, $7)`,
				pgqueQueue, k, slots, tokens[k], acks[k][0], acks[k][1], acks[k][2])
			if err != nil {
				return err
			}
			var next [3]*int64
			for rows.Next() {
				var msgID, batchID, epoch int64
				if err := rows.Scan(&msgID, &batchID, &epoch); err != nil {
					rows.Close()
					return err
				}
				if got == 0 {
					next = [3]*int64{&epoch, &batchID, &msgID}
				}
				got++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			acks[k] = next
			return tx.QueryRow(ctx, "select pg_current_xact_id_if_assigned()::text::bigint").Scan(&xid)
		})
		if err != nil {
			return 0, 0, fmt.Errorf("receive_partitioned_raw slot %d: %w", k, err)
		}
		if xid == nil {
			return got, 0, nil
		}
		return got, *xid, nil
	}
	// Drain what the send cases left (nobody ticked since they sent).
	if err := tick(ctx, c, pgqueQueue); err != nil {
		return err
	}
	for k := range slots {
		for {
			got, _, err := receive(k)
			if err != nil {
				return err
			}
			if got == 0 {
				break
			}
		}
	}
	const key = "tenant-wal"
	var touched int
	if err := c.QueryRow(ctx, "select ((hashtextextended($1, 0) % $2 + $2) % $2)::int", key, slots).Scan(&touched); err != nil {
		return err
	}
	var start string
	if err := c.QueryRow(ctx, "select pg_current_wal_insert_lsn()::text").Scan(&start); err != nil {
		return err
	}
	var tickXids, chunkXids, ackXids, emptyXids []int64
	silent := 0 // untouched calls that wrote nothing
	for i := range reps {
		if _, err := c.Exec(ctx, "select pgque.send($1, $2, $3::jsonb, $4)", pgqueQueue, eventType, payload(i), key); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		var xid int64
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "select pgque.force_next_tick($1)", pgqueQueue); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "select pgque.ticker($1)", pgqueQueue); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid)
		})
		if err != nil {
			return fmt.Errorf("tick: %w", err)
		}
		tickXids = append(tickXids, xid)
		for k := range slots {
			got, xid, err := receive(k)
			if err != nil {
				return err
			}
			switch {
			case k == touched && got != 1:
				return fmt.Errorf("slot %d received %d events of a tick holding one event for it", k, got)
			case k == touched:
				chunkXids = append(chunkXids, xid)
				got, xid, err := receive(k)
				if err != nil {
					return err
				}
				if got != 0 {
					return fmt.Errorf("slot %d received %d more events after its one", k, got)
				}
				ackXids = append(ackXids, xid)
			case got != 0:
				return fmt.Errorf("slot %d received %d events of a tick holding none for it", k, got)
			case xid == 0:
				silent++
			default:
				emptyXids = append(emptyXids, xid)
			}
		}
	}
	classes := []struct {
		name, about string
		xids        []int64
		per         int
	}{
		{"tick", "a tick of one event (force_next_tick + ticker)", tickXids, reps},
		{"slot_chunk", "the touched slot's receive, handing out the event", chunkXids, reps},
		{"slot_ack", "the touched slot's next receive, acknowledging the chunk, finding nothing", ackXids, reps},
		{"slot_untouched", "an untouched slot's receive, finishing a batch with nothing for it", emptyXids, reps * (slots - 1)},
	}
	for _, cl := range classes {
		recs, advance, err := walRecordsSince(ctx, c, start, cl.xids, float64(cl.per), inspect)
		if err != nil {
			return fmt.Errorf("%s: %w", cl.name, err)
		}
		e.logf("   %s (%s), per call over %d:", cl.name, cl.about, cl.per)
		if !inspect {
			continue
		}
		var total float64
		e.logf("   | record | relation | records/call | bytes/call |")
		e.logf("   | --- | --- | ---: | ---: |")
		for _, rec := range recs {
			total += rec.bytes
			e.logf("   | %s/%s | %s | %.2f | %.1f |", rec.rmgr, rec.kind, rec.rel, rec.count, rec.bytes)
		}
		e.logf("   | total | | | %.1f |", total)
		_ = advance // the position's advance spans every class at once
		r.add(cl.name+"_total", single(total), "bytes/call", nil, cl.about)
	}
	if silent > 0 {
		e.logf("   %d of %d untouched slots' calls wrote nothing", silent, reps*(slots-1))
	}
	return nil
}

// walCaseName is the report case of one record kind, e.g.
// send_Heap_INSERT_event_1_0.
func walCaseName(cse string, rec walRecord) string {
	rel := strings.TrimPrefix(rec.rel, "pgque.")
	return strings.NewReplacer(" ", "_", "+", "_", "/", "_").Replace(fmt.Sprintf("%s_%s_%s_%s", cse, rec.rmgr, rec.kind, rel))
}

// walSend runs one transaction of case wc and returns its xid.
func walSend(ctx context.Context, c *pgx.Conn, wc walCase, seq *int) (int64, error) {
	var xid int64
	err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		var dedup any
		if wc.dedup {
			dedup = fmt.Sprintf("dedup-%d", *seq)
		}
		switch {
		case wc.upstream:
			if _, err := tx.Exec(ctx, upstreamSendSQL, pgqueQueue, eventType, payload(*seq), tenantKey(*seq)); err != nil {
				return fmt.Errorf("upstream send: %w", err)
			}
		case wc.events == 1:
			if _, err := tx.Exec(ctx, "select pgque.send($1, $2, $3::jsonb, $4, $5)", pgqueQueue, eventType, payload(*seq), tenantKey(*seq), dedup); err != nil {
				return fmt.Errorf("send: %w", err)
			}
		default:
			payloads, keys := batchPayloads(*seq, wc.events)
			if _, err := tx.Exec(ctx, pgqueSendBatchSQL, eventType, payloads, keys); err != nil {
				return fmt.Errorf("send_batch: %w", err)
			}
		}
		*seq += wc.events
		return tx.QueryRow(ctx, "select pg_current_xact_id()::text::bigint").Scan(&xid)
	})
	return xid, err
}

// walBlockRel matches the relation of a block reference: "rel
// <tablespace>/<database>/<relfilenode>".
var walBlockRel = regexp.MustCompile(`rel \d+/\d+/(\d+)`)

// walMeasure runs reps transactions of wc and returns their records and
// the WAL position's advance per event (see walRecordsSince).
func walMeasure(ctx context.Context, c *pgx.Conn, wc walCase, reps int, seq *int, inspect bool) ([]walRecord, float64, error) {
	var start string
	if err := c.QueryRow(ctx, "select pg_current_wal_insert_lsn()::text").Scan(&start); err != nil {
		return nil, 0, err
	}
	xids := make([]int64, 0, reps)
	for range reps {
		xid, err := walSend(ctx, c, wc, seq)
		if err != nil {
			return nil, 0, err
		}
		xids = append(xids, xid)
	}
	return walRecordsSince(ctx, c, start, xids, float64(reps*wc.events), inspect)
}

// walRecordsSince returns the records that transactions xids wrote since
// WAL position start, per unit (n units in all), grouped by kind and
// relation, largest first, and the advance of the WAL insert position per
// unit: the records plus their alignment to 8 bytes and the page headers,
// and whatever another session wrote meanwhile. Without inspect only the
// advance is measured.
func walRecordsSince(ctx context.Context, c *pgx.Conn, start string, xids []int64, n float64, inspect bool) ([]walRecord, float64, error) {
	// The commit record of the last transaction must be flushed for
	// pg_get_wal_records_info to read it.
	var end string
	var advance float64
	if err := c.QueryRow(ctx, "select pg_current_wal_flush_lsn()::text, pg_current_wal_insert_lsn() - $1::pg_lsn", start).Scan(&end, &advance); err != nil {
		return nil, 0, err
	}
	// The xid of a record is the 32-bit one; transactions of this run are
	// far from wraparound, so the low 32 bits of the xid8 identify them.
	low := make([]int64, len(xids))
	for i, x := range xids {
		low[i] = x & 0xffffffff
	}
	if !inspect {
		return nil, advance / n, nil
	}
	// A send that catches an error (the dedup path) writes in a
	// subtransaction: its records carry the subtransaction's xid, which the
	// commit record lists.
	subs, err := walSubxacts(ctx, c, start, end, low)
	if err != nil {
		return nil, 0, err
	}
	low = append(low, subs...)
	rows, err := c.Query(ctx, `select resource_manager, split_part(record_type, ' ', 1), coalesce(block_ref, ''),
	       record_length, fpi_length
	  from pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
	 where xid::text::bigint = any($3)`, start, end, low)
	if err != nil {
		return nil, 0, fmt.Errorf("pg_get_wal_records_info: %w", err)
	}
	type key struct{ rmgr, kind, node string }
	sums := map[key]*walRecord{}
	var order []key
	for rows.Next() {
		var rmgr, kind, blk string
		var length, fpi int64
		if err := rows.Scan(&rmgr, &kind, &blk, &length, &fpi); err != nil {
			rows.Close()
			return nil, 0, err
		}
		node := ""
		if m := walBlockRel.FindStringSubmatch(blk); m != nil {
			node = m[1]
		}
		k := key{rmgr, kind, node}
		if sums[k] == nil {
			sums[k] = &walRecord{rmgr: rmgr, kind: kind}
			order = append(order, k)
		}
		s := sums[k]
		s.count++
		s.bytes += float64(length)
		s.fpi += float64(fpi)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var out []walRecord
	for _, k := range order {
		s := sums[k]
		s.rel = "–"
		if k.node != "" {
			if err := c.QueryRow(ctx, `select coalesce((select c.oid::regclass::text from pg_class c
			     where pg_relation_filenode(c.oid) = $1::oid limit 1), 'filenode ' || $1)`, k.node).Scan(&s.rel); err != nil {
				return nil, 0, err
			}
		}
		s.count /= n
		s.bytes /= n
		s.fpi /= n
		out = append(out, *s)
	}
	slices.SortStableFunc(out, func(a, b walRecord) int {
		switch {
		case a.bytes > b.bytes:
			return -1
		case a.bytes < b.bytes:
			return 1
		}
		return 0
	})
	return out, advance / n, nil
}

// walSubxactsRE matches the subtransactions a commit record lists.
var walSubxactsRE = regexp.MustCompile(`subxacts:((?: \d+)+)`)

// walSubxacts returns the xids of the subtransactions of the transactions
// xids committed between start and end.
func walSubxacts(ctx context.Context, c *pgx.Conn, start, end string, xids []int64) ([]int64, error) {
	rows, err := c.Query(ctx, `select description from pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
	 where resource_manager = 'Transaction' and xid::text::bigint = any($3)`, start, end, xids)
	if err != nil {
		return nil, fmt.Errorf("pg_get_wal_records_info: %w", err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var desc string
		if err := rows.Scan(&desc); err != nil {
			return nil, err
		}
		if m := walSubxactsRE.FindStringSubmatch(desc); m != nil {
			for _, f := range strings.Fields(m[1]) {
				x, err := strconv.ParseInt(f, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("commit record %q: %w", desc, err)
				}
				out = append(out, x)
			}
		}
	}
	return out, rows.Err()
}

// walRowWidth prints the stored size of each column of the last event row
// a keyed send wrote, and of the whole row.
func walRowWidth(ctx context.Context, e *env, r *recorder, c *pgx.Conn) error {
	rows, err := c.Query(ctx, `select a.attname::text, format_type(a.atttypid, a.atttypmod)
	  from pg_attribute a where a.attrelid = 'pgque.event'::regclass and a.attnum > 0 and not a.attisdropped order by a.attnum`)
	if err != nil {
		return err
	}
	var cols, types []string
	for rows.Next() {
		var col, typ string
		if err := rows.Scan(&col, &typ); err != nil {
			rows.Close()
			return err
		}
		cols, types = append(cols, col), append(types, typ)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var sel []string
	for _, col := range cols {
		sel = append(sel, fmt.Sprintf("coalesce(pg_column_size(%s), 0)", pgx.Identifier{col}.Sanitize()))
	}
	sizes := make([]int64, len(cols)+1)
	dest := make([]any, len(sizes))
	for i := range sizes {
		dest[i] = &sizes[i]
	}
	q := fmt.Sprintf(`select pg_column_size(e.*)::bigint, %s from pgque.event e
	  where ev_extra1 is not null and ev_dedup is null order by ev_time desc, ev_id desc limit 1`, strings.Join(sel, ", "))
	if err := c.QueryRow(ctx, q).Scan(dest...); err != nil {
		return fmt.Errorf("reading the row's column sizes: %w", err)
	}
	e.logf("   event row of a keyed send: %d bytes as a datum (column data plus a 24-byte header)", sizes[0])
	e.logf("   | column | type | bytes |")
	e.logf("   | --- | --- | ---: |")
	for i, col := range cols {
		e.logf("   | %s | %s | %d |", col, types[i], sizes[i+1])
	}
	r.add("row_datum", single(float64(sizes[0])), "bytes", nil, "pg_column_size of the event row of a keyed send")
	return nil
}
