package bench

import (
	"context"
	"time"
)

// Producing: pgque's send and send_batch, in SQL and through the Go client,
// against the physical floor (a raw INSERT into an event-shaped table in the
// same database) and PgQ's insert_event (its own database, same cluster),
// all in interleaved rounds.

func init() {
	register(&suite{
		name:  "produce",
		about: "pgque send / send_batch (SQL and Go client) vs raw INSERT and PgQ insert_event",
		run:   runProduce,
	})
}

func runProduce(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgque(ctx, e, "bench_produce", 40)
	if err != nil {
		return err
	}
	f, err := newFloor(ctx, p.pool)
	if err != nil {
		return err
	}
	shapeNote, err := checkFloorShape(ctx, p.pool)
	if err != nil {
		return err
	}
	if shapeNote != "" {
		e.logf("   WARNING: %s", shapeNote)
	}
	// A second queue with a 16-slot partitioned consumer subscribed: the
	// partition layer adds a routing index to its event tables, which every
	// send then maintains.
	const routed = "routed"
	if err := execAll(ctx, p.dsn, "select pgque.create_queue('routed')",
		"select pgque.subscribe_slot('routed', 'workers', k, 16) from generate_series(0, 15) k",
		"select pgque.maint_route_indexes()"); err != nil {
		return err
	}
	q, err := optionalPgQ(ctx, e)
	if err != nil {
		return err
	}
	gc, err := newGoProducer(ctx, p)
	if err != nil {
		return err
	}
	defer gc.close()

	d := pick(e, 300*time.Millisecond, 3*time.Second)
	n := pick(e, 3, 5)
	// Every case starts from empty event tables, as the floor's (which
	// truncates its table) do: otherwise pgque's and PgQ's tables would hold
	// every earlier round's rows, a bigger index for each later case.
	empty := func(f func(context.Context) (float64, error)) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			if _, err := p.pool.Exec(ctx, "truncate pgque.event"); err != nil {
				return 0, err
			}
			if q != nil {
				if _, err := q.pool.Exec(ctx, "truncate pgq.event_template"); err != nil {
					return 0, err
				}
			}
			return f(ctx)
		}
	}
	m, err := e.rounds(ctx, n, withPgQ(q,
		trial{"send_1conn", empty(func(ctx context.Context) (float64, error) { return p.sendRate(ctx, 1, d) })},
		trial{"floor_insert_1conn", func(ctx context.Context) (float64, error) { return f.insertRate(ctx, 1, d) }},
		trial{"pgq_insert_event_1conn", empty(func(ctx context.Context) (float64, error) { return q.insertRate(ctx, 1, d) })},
		trial{"send_16conn", empty(func(ctx context.Context) (float64, error) { return p.sendRate(ctx, 16, d) })},
		trial{"send_text_16conn", empty(func(ctx context.Context) (float64, error) { return p.sendTextRate(ctx, 16, d) })},
		trial{"floor_insert_16conn", func(ctx context.Context) (float64, error) { return f.insertRate(ctx, 16, d) }},
		trial{"pgq_insert_event_16conn", empty(func(ctx context.Context) (float64, error) { return q.insertRate(ctx, 16, d) })},
		trial{"send_16conn_routed_N16", empty(func(ctx context.Context) (float64, error) { return p.sendRateTo(ctx, routed, 16, d) })},
		trial{"go_send_16", empty(func(ctx context.Context) (float64, error) { return gc.sendRate(ctx, 16, d) })},
		trial{"go_send_16_direct", empty(func(ctx context.Context) (float64, error) { return gc.sendRateDirect(ctx, 16, d) })},
		trial{"go_send_64", empty(func(ctx context.Context) (float64, error) { return gc.sendRate(ctx, 64, d) })},
		trial{"send_batch_1000", empty(func(ctx context.Context) (float64, error) { return p.sendBatchRate(ctx, d) })},
		trial{"send_batch_text_1000", empty(func(ctx context.Context) (float64, error) { return p.sendBatchTextRate(ctx, d) })},
		trial{"send_batch_mixed_1000", empty(func(ctx context.Context) (float64, error) { return p.sendBatchMixedRate(ctx, d) })},
		trial{"floor_insert_select_1000", func(ctx context.Context) (float64, error) { return f.insertSelectRate(ctx, d) }},
		trial{"pgq_insert_event_batch_1000", empty(func(ctx context.Context) (float64, error) { return q.batchRate(ctx, d) })},
		trial{"go_send_batch_1000", empty(func(ctx context.Context) (float64, error) { return gc.sendBatchRate(ctx, d) })},
	)...)
	if err != nil {
		return err
	}
	const u = "events/s"
	floorNote := "raw INSERT into a table shaped like pgque.event, same database"
	if shapeNote != "" {
		floorNote += "; " + shapeNote
	}
	r.compare("send_1conn", m["send_1conn"], "floor_insert_1conn", m["floor_insert_1conn"], u, nil, floorNote)
	r.compare("send_1conn", m["send_1conn"], "pgq_insert_event_1conn", m["pgq_insert_event_1conn"], u, nil, "")
	r.compare("send_16conn", m["send_16conn"], "floor_insert_16conn", m["floor_insert_16conn"], u, atLeast(0.8), floorNote)
	r.compare("send_16conn", m["send_16conn"], "pgq_insert_event_16conn", m["pgq_insert_event_16conn"], u, atLeast(1.2), "")
	// The text form (what the Go client calls) against the same references
	// and targets: the payload arrives as the JSON text it already is.
	r.compare("send_text_16conn", m["send_text_16conn"], "floor_insert_16conn", m["floor_insert_16conn"], u, atLeast(0.8), floorNote)
	r.compare("send_text_16conn", m["send_text_16conn"], "pgq_insert_event_16conn", m["pgq_insert_event_16conn"], u, atLeast(1.2), "")
	r.compare("send_text_16conn", m["send_text_16conn"], "send_16conn", m["send_16conn"], u, nil, "send(queue, type, payload text, key) vs the jsonb form")
	r.compare("send_16conn_routed_N16", m["send_16conn_routed_N16"], "send_16conn", m["send_16conn"], u, nil,
		"send to a queue with a 16-slot consumer subscribed (its routing index is maintained on every insert) vs a queue without")
	r.compare("send_16conn_routed_N16", m["send_16conn_routed_N16"], "floor_insert_16conn", m["floor_insert_16conn"], u, nil, "")
	r.compare("go_send_16", m["go_send_16"], "send_16conn", m["send_16conn"], u, nil,
		"Client.Send from 16 goroutines over the client's pool vs the same SQL on 16 raw connections")
	r.compare("go_send_16", m["go_send_16"], "floor_insert_16conn", m["floor_insert_16conn"], u, nil, "")
	r.compare("go_send_16", m["go_send_16"], "pgq_insert_event_16conn", m["pgq_insert_event_16conn"], u, nil, "")
	r.compare("go_send_16", m["go_send_16"], "go_send_16_direct", m["go_send_16_direct"], u, nil,
		"Sends coalesced while SendConcurrency statements run (the default) vs every Send its own call")
	r.compare("go_send_64", m["go_send_64"], "floor_insert_16conn", m["floor_insert_16conn"], u, nil,
		"Client.Send from 64 goroutines, coalesced")
	r.compare("send_batch_1000", m["send_batch_1000"], "floor_insert_select_1000", m["floor_insert_select_1000"], u, atLeast(0.8), floorNote)
	r.compare("send_batch_1000", m["send_batch_1000"], "pgq_insert_event_batch_1000", m["pgq_insert_event_batch_1000"], u, atLeast(2), "")
	r.compare("send_batch_text_1000", m["send_batch_text_1000"], "floor_insert_select_1000", m["floor_insert_select_1000"], u, atLeast(0.8), floorNote)
	r.compare("send_batch_text_1000", m["send_batch_text_1000"], "send_batch_1000", m["send_batch_1000"], u, nil, "send_batch with payloads text[] vs jsonb[]")
	r.compare("send_batch_mixed_1000", m["send_batch_mixed_1000"], "send_batch_text_1000", m["send_batch_text_1000"], u, atLeast(0.9),
		"send_batch with one type per payload (4 types, alternating) vs one type for all")
	r.compare("go_send_batch_1000", m["go_send_batch_1000"], "send_batch_1000", m["send_batch_1000"], u, nil,
		"Client.SendBatch of 1000 vs the same SQL")
	r.compare("go_send_batch_1000", m["go_send_batch_1000"], "floor_insert_select_1000", m["floor_insert_select_1000"], u, nil, "")
	return nil
}
