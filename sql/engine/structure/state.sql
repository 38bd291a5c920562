-- Append-only delivery state: ticks and the subscription state log.
--
-- Under a held xmin horizon (a REPEATABLE READ transaction, pg_dump,
-- hot_standby_feedback) no dead row version can be pruned, so anything
-- updated or deleted per tick, batch or chunk piles up and slows every
-- read. Ticks and subscription state are therefore only ever INSERTed, into
-- tables list-partitioned by a generation (0 or 1). A sequence per family
-- names the generation new rows go to (its value modulo 2; a sequence is
-- changed in place, so moving it makes no row version). maint() moves it
-- and, under an ACCESS EXCLUSIVE lock on the partition being retired,
-- copies the rows still needed into the other partition and TRUNCATEs the
-- retired one (see _state_flip and _tick_flip in functions/pgque.maint.sql).
-- Space is reclaimed by TRUNCATE only, as for event tables.

-- rotation: one row per flipped family, never updated: flips lock it so
-- that two maint() calls never flip the same family at once.
create table if not exists pgque.rotation (
    rot_name text primary key check (rot_name in ('tick', 'state'))
);
insert into pgque.rotation (rot_name) values ('tick'), ('state') on conflict (rot_name) do nothing;
create sequence if not exists pgque.tick_gen_seq;
create sequence if not exists pgque.state_gen_seq;

-- _gen(name): the generation ('tick' or 'state') new rows go to. It is the
-- column default of tick_gen and st_gen, so inserting code names no
-- partition. Inlined into the INSERT that evaluates it (no SET clause, and
-- volatile, as pg_sequence_last_value is, so the planner may): a SQL
-- function that is not inlined is planned again at every call, which cost
-- each state record about 10 us. Every name in the body is qualified, as
-- in any function without a pinned search_path.
create or replace function pgque._gen(i_name text)
returns integer language sql volatile
as $$
    select (coalesce(pg_catalog.pg_sequence_last_value(
                case i_name when 'tick' then 'pgque.tick_gen_seq'::pg_catalog.regclass
                            else 'pgque.state_gen_seq'::pg_catalog.regclass end), 0)
            operator(pg_catalog.%) 2)::integer
$$;

-- A tick is a queue position: the snapshot and event sequence at a moment.
-- tick_id is unique (a sequence); during a flip a needed tick is copied
-- to the other generation before its old copy is truncated, so the index
-- is not unique.
do $tick$
begin
    -- Installs before the append-only design kept ticks in a plain table,
    -- cleaned up with DELETE: move its rows into the partitioned one.
    if exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'pgque' and c.relname = 'tick' and c.relkind = 'r') then
        alter table pgque.tick rename to tick_plain;
        alter table pgque.tick_plain rename constraint tick_pkey to tick_plain_pkey;
    end if;
end
$tick$;

create table if not exists pgque.tick (
    tick_queue     integer not null,
    tick_id        bigint not null,
    tick_time      timestamptz not null,
    tick_snapshot  pg_snapshot not null,
    tick_event_seq bigint not null,
    tick_gen       integer not null default pgque._gen('tick')
) partition by list (tick_gen);
create table if not exists pgque.tick_0 partition of pgque.tick for values in (0);
create table if not exists pgque.tick_1 partition of pgque.tick for values in (1);
select pgque._create_index('tick_queue_id_idx', $ddl$create index tick_queue_id_idx on pgque.tick (tick_queue, tick_id)$ddl$);

-- tick_xid: the ticker's transaction id, when it was assigned after the
-- ticker read the event sequence and the sequence had not moved by the
-- time the tick was written (NULL otherwise, and in ticks written before
-- the column existed). Every producer takes its transaction id before its
-- event ids, so a transaction holding an ev_id the tick covers has a
-- transaction id below tick_xid: once no transaction below it is running,
-- no event the tick's snapshot missed can still commit (see _tick_due).
select pgque._add_column('pgque.tick', 'tick_xid',
    $ddl$alter table pgque.tick add column tick_xid xid8$ddl$);

do $tick$
declare
    f regprocedure;
begin
    if exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'pgque' and c.relname = 'tick_plain') then
        insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq)
        select tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq from pgque.tick_plain;
        -- Functions taking the old row type (their files create them again
        -- later in this install) would keep the old table alive.
        for f in select d.objid::regprocedure
                   from pg_catalog.pg_depend d
                  where d.classid = 'pg_catalog.pg_proc'::regclass
                    and d.refclassid = 'pg_catalog.pg_type'::regclass
                    and d.refobjid = (select c.reltype from pg_catalog.pg_class c
                                       where c.oid = 'pgque.tick_plain'::regclass) loop
            execute format('drop function %s', f);
        end loop;
        drop table pgque.tick_plain;
    end if;
end
$tick$;

-- sub_state: the subscription state log. Every change of a subscription's
-- cursor, open batch or chunk progress appends one record; the current state
-- is the record with the highest st_seq (index (st_sub, st_seq desc),
-- limit 1); register_consumer appends the first. Writers hold the
-- subscription row's lock
-- (FOR NO KEY UPDATE: a lock marks the row in place and makes no version),
-- so records of one subscription are appended one at a time, in st_seq
-- order. Records of dropped subscriptions are simply not carried over by
-- the next flip (subscription ids are never reused).
--   st_last_tick      the cursor: the batch's first tick, or the last tick consumed
--   st_next_tick      the open batch's last tick (NULL: no batch open)
--   st_batch          the open batch id (NULL: none)
--   st_acked_to       last ev_id of the open batch acknowledged (NULL: none yet)
--   st_delivered_to   last ev_id handed out by the last receive (NULL: none pending)
--   st_delivered_all  the last receive reached the batch's end
create sequence if not exists pgque.sub_state_seq;
create table if not exists pgque.sub_state (
    st_sub           integer not null,
    st_seq           bigint not null,
    st_time          timestamptz not null default now(),
    st_last_tick     bigint not null,
    st_next_tick     bigint,
    st_batch         bigint,
    st_acked_to      bigint,
    st_delivered_to  bigint,
    st_delivered_all boolean not null default false,
    st_gen           integer not null default pgque._gen('state')
) partition by list (st_gen);
create table if not exists pgque.sub_state_0 partition of pgque.sub_state for values in (0);
create table if not exists pgque.sub_state_1 partition of pgque.sub_state for values in (1);
select pgque._create_index('sub_state_sub_idx', $ddl$create index sub_state_sub_idx on pgque.sub_state (st_sub, st_seq desc)$ddl$);

-- st_moved: when the state last moved (a cursor, batch or chunk change).
-- A heartbeat copy (_touch_state) keeps the copied record's st_moved and
-- takes a new st_time, so "renewed but made no progress" can be told apart
-- from "consumed" (pgque.partition_slot_stalls). Added after the table, so
-- that old and new installs have the same column order; NULL in records
-- written before it existed means st_time. Guarded by the catalog:
-- ALTER TABLE locks the table before it looks, and a re-install must not
-- take an exclusive lock on the state log of running consumers.
select pgque._add_column('pgque.sub_state', 'st_moved',
    $ddl$alter table pgque.sub_state add column st_moved timestamptz$ddl$);

-- Subscriptions registered by versions that kept their state in the
-- subscription row get their first record from it.
insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch)
select s.sub_id, nextval('pgque.sub_state_seq'), s.sub_active, s.sub_last_tick, s.sub_next_tick, s.sub_batch
  from pgque.subscription s
 where not exists (select 1 from pgque.sub_state x where x.st_sub = s.sub_id);
