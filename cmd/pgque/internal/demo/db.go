package demo

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Names of the demo's objects.
const (
	// Queue is the queue the demo creates (and drops first if it exists).
	Queue = "pgque_demo"
	// Consumer is the partitioned consumer shared by the worker processes.
	Consumer = "demo_apply"
	// Schema holds the demo's state tables (dropped first if it exists).
	Schema = "pgque_demo"
)

// schemaSQL creates the demo's state: one row per tenant (the highest
// sequence number applied), the files, and a log of every application.
const schemaSQL = `
drop schema if exists pgque_demo cascade;
create schema pgque_demo;

create table pgque_demo.tenant (
    tenant  text primary key,
    max_seq integer not null default 0
);

create table pgque_demo.files (
    tenant  text not null,
    file    text not null,
    version integer not null,
    deleted boolean not null,
    seq     integer not null, -- the tenant sequence number that wrote this state
    primary key (tenant, file)
);

create table pgque_demo.applied (
    id        bigint generated always as identity primary key,
    tenant    text not null,
    seq       integer not null,
    ev_id     bigint not null,
    worker    text not null,
    slot      integer not null,
    retry     integer not null,
    reordered boolean not null
);
create index on pgque_demo.applied (tenant, seq);

-- apply(...): applies one event to its tenant's files and logs it, under
-- the tenant row's lock. Returns 'ok', 'reordered' (lenient runs: applied
-- after a later event of the tenant), 'duplicate' (already applied: not
-- applied again), or, in strict runs, 'violation: ...' without applying.
create function pgque_demo.apply(i_tenant text, i_seq integer, i_type text, i_file text, i_version integer,
                                 i_strict boolean, i_ev_id bigint, i_worker text, i_slot integer, i_retry integer)
returns text language plpgsql as $$
declare
    v_max  integer;
    v_file pgque_demo.files;
begin
    select max_seq into v_max from pgque_demo.tenant where tenant = i_tenant for update;
    if not found then
        return format('violation: unknown tenant %s', i_tenant);
    end if;
    if exists (select 1 from pgque_demo.applied where tenant = i_tenant and seq = i_seq) then
        return 'duplicate';
    end if;
    if i_strict then
        if i_seq <> v_max + 1 then
            return format('violation: tenant %s got seq %s after seq %s (gap or reorder)', i_tenant, i_seq, v_max);
        end if;
        select * into v_file from pgque_demo.files where tenant = i_tenant and file = i_file;
        if i_type = 'FileCreated' and v_file.file is not null and not v_file.deleted then
            return format('violation: tenant %s seq %s creates %s, which exists', i_tenant, i_seq, i_file);
        elsif i_type <> 'FileCreated' and (v_file.file is null or v_file.deleted) then
            return format('violation: tenant %s seq %s: %s of %s, which does not exist', i_tenant, i_seq, i_type, i_file);
        elsif i_type = 'FileOverwritten' and i_version <> v_file.version + 1 then
            return format('violation: tenant %s seq %s overwrites %s v%s with v%s', i_tenant, i_seq, i_file, v_file.version, i_version);
        end if;
    end if;
    insert into pgque_demo.files as f (tenant, file, version, deleted, seq)
    values (i_tenant, i_file, i_version, i_type = 'FileDeleted', i_seq)
    on conflict (tenant, file) do update
        set version = excluded.version, deleted = excluded.deleted, seq = excluded.seq
        where f.seq < excluded.seq;
    insert into pgque_demo.applied (tenant, seq, ev_id, worker, slot, retry, reordered)
    values (i_tenant, i_seq, i_ev_id, i_worker, i_slot, i_retry, i_seq < v_max);
    update pgque_demo.tenant set max_seq = greatest(max_seq, i_seq) where tenant = i_tenant;
    return case when i_seq < v_max then 'reordered' else 'ok' end;
end;
$$;
`

// createSchema (re)creates the demo's tables and registers the tenants.
func createSchema(ctx context.Context, pool *pgxpool.Pool, tenants []string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, schemaSQL); err != nil {
			return fmt.Errorf("creating the demo schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `insert into pgque_demo.tenant (tenant) select unnest($1::text[])`, tenants); err != nil {
			return fmt.Errorf("registering tenants: %w", err)
		}
		return nil
	})
}

// dropSchema removes the demo's tables.
func dropSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `drop schema if exists pgque_demo cascade`)
	return err
}

// applyEvent calls pgque_demo.apply.
func applyEvent(ctx context.Context, pool *pgxpool.Pool, typ string, p *payload, strict bool, evID int64, worker string, slot, retry int) (string, error) {
	var res string
	err := pool.QueryRow(ctx, `select pgque_demo.apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		p.Tenant, p.Seq, typ, p.File, p.Version, strict, evID, worker, slot, retry).Scan(&res)
	return res, err
}
