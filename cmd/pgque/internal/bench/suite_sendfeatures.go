package bench

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// The producer features: what a dedup key costs a send, that a send without
// one costs what it did before the feature, and what emitting events from a
// table trigger costs against writing the row and calling send yourself.

func init() {
	register(&suite{
		name:  "produce-features",
		about: "send with a dedup key vs without; a table trigger vs INSERT plus an explicit send",
		run:   runSendFeatures,
	})
}

// preDedupSendSQL recreates, under another name, send as it was before the
// dedup key existed (the four-argument PL/pgSQL function), so "a send
// without a key pays nothing" is measured against the real old code.
const preDedupSendSQL = `
create or replace function pgque.bench_send_before_dedup(i_queue text, i_type text, i_payload jsonb, i_partition_key text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_payload is null or i_type is null then
        raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
    end if;
    return pgque._insert_event(i_queue, i_type, i_payload::text, i_partition_key, null, null, null);
end;
$$`

// The trigger case's tables: the same shape twice, one attached to queue
// "bench_trg" (the trigger sends), one plain (the client sends).
var triggerTablesSQL = []string{
	`select pgque.create_queue('bench_trg')`,
	`create table public.files_trg (id bigint primary key, tenant text not null, path text not null, size integer not null)`,
	`create table public.files_plain (id bigint primary key, tenant text not null, path text not null, size integer not null)`,
	`select pgque.attach_table('bench_trg', 'public.files_trg', 'tenant')`,
}

const (
	insertTrgSQL = `insert into public.files_trg (id, tenant, path, size) values ($1, $2, $3, $4)`
	// The same INSERT and a send of the same event (type, row as JSON,
	// key, table), in one statement so both sides make one round trip.
	insertSendSQL = `with ins as (insert into public.files_plain (id, tenant, path, size) values ($1, $2, $3, $4) returning *)
		select pgque.send('bench_trg', 'insert', to_jsonb(ins), ins.tenant) from ins`
)

func runSendFeatures(ctx context.Context, e *env, r *recorder) error {
	p, err := newPgque(ctx, e, "bench_sendfeat", 40)
	if err != nil {
		return err
	}
	if err := execAll(ctx, p.dsn, append([]string{preDedupSendSQL}, triggerTablesSQL...)...); err != nil {
		return err
	}
	d := pick(e, 300*time.Millisecond, 3*time.Second)
	n := pick(e, 3, 5)
	loop := func(conns int, sql string, args func(i int) []any) func(context.Context) (float64, error) {
		return func(ctx context.Context) (float64, error) {
			return connLoop(ctx, p.pool, conns, d, func(ctx context.Context, c *pgx.Conn) (int, error) {
				_, err := c.Exec(ctx, sql, args(int(p.next.Add(1)))...)
				return 1, err
			})
		}
	}
	plain := func(i int) []any { return []any{pgqueQueue, eventType, payload(i), tenantKey(i)} }
	// Every send carries a fresh key (the retry-safe producer's common
	// case: each key stored once).
	keyed := func(i int) []any {
		return []any{pgqueQueue, eventType, payload(i), tenantKey(i), "req-" + strconv.Itoa(i)}
	}
	// A retried send: the key was stored by the send before.
	repeat := func(i int) []any {
		return []any{pgqueQueue, eventType, payload(i), tenantKey(i), "req-" + strconv.Itoa(i/2)}
	}
	row := func(i int) []any {
		return []any{int64(i), tenantKey(i), "/bucket/objects/" + strconv.Itoa(i), 4096 + i%8192}
	}
	m, err := e.rounds(ctx, n,
		trial{"send_16conn", loop(16, pgqueSendSQL, plain)},
		trial{"send_before_dedup_16conn", loop(16, `select pgque.bench_send_before_dedup($1, $2, $3::jsonb, $4)`, plain)},
		trial{"send_dedup_16conn", loop(16, `select pgque.send($1, $2, $3::jsonb, $4, $5)`, keyed)},
		trial{"send_dedup_half_repeats_16conn", loop(16, `select pgque.send($1, $2, $3::jsonb, $4, $5)`, repeat)},
		trial{"insert_trigger_1conn", loop(1, insertTrgSQL, row)},
		trial{"insert_plus_send_1conn", loop(1, insertSendSQL, row)},
		trial{"insert_trigger_16conn", loop(16, insertTrgSQL, row)},
		trial{"insert_plus_send_16conn", loop(16, insertSendSQL, row)},
	)
	if err != nil {
		return err
	}
	const u = "events/s"
	r.compare("send_dedup_16conn", m["send_dedup_16conn"], "send_16conn", m["send_16conn"], u, atLeast(0.8),
		"send with a fresh dedup key per event vs without a key")
	r.compare("send_dedup_half_repeats_16conn", m["send_dedup_half_repeats_16conn"], "send_16conn", m["send_16conn"], u, nil,
		"every second send repeats the previous key (returns its ev_id, stores nothing)")
	r.compare("send_16conn", m["send_16conn"], "send_before_dedup_16conn", m["send_before_dedup_16conn"], u, atLeast(0.95),
		"send without a key vs the send function as it was before dedup keys")
	r.compare("insert_trigger_1conn", m["insert_trigger_1conn"], "insert_plus_send_1conn", m["insert_plus_send_1conn"], u, atLeast(1),
		"single-row INSERT into an attached table vs the same INSERT plus pgque.send in one statement")
	r.compare("insert_trigger_16conn", m["insert_trigger_16conn"], "insert_plus_send_16conn", m["insert_plus_send_16conn"], u, atLeast(1), "")
	return nil
}
