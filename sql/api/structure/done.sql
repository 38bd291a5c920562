-- Completion records: what marks an event done for its consumer when a
-- handler applied its effects in its own transaction (complete_in_tx,
-- complete_partitioned_in_tx). Design: docs/design.md, "Transactional
-- handlers".
--
-- A record says "event ev_id is done for subscription sub" (it was
-- delivered in batch batch_id). It is keyed by the event, not the batch:
-- a key lane's held event may come back in a later batch after a crash,
-- and must then be found done. It is INSERTed in the handler's transaction, so it commits or rolls
-- back with the handler's writes, and is never updated or deleted: like
-- sub_state, the table is list-partitioned by a generation (0 or 1, named
-- by done_gen_seq's value modulo 2) and maint() (the 'done_flip' layer
-- hook) copies the records still needed (those of each subscription's open
-- batch, and those of events whose held copy waits in deferred) into the
-- other generation and TRUNCATEs the retired one. A held
-- xmin horizon therefore leaves no dead row versions behind.

create sequence if not exists pgque.done_gen_seq;

-- done_rotation: one row, never updated; a flip locks it so that two
-- maint() calls never flip completion records at once.
create table if not exists pgque.done_rotation (
    singleton boolean primary key default true check (singleton)
);
insert into pgque.done_rotation default values on conflict do nothing;

-- _done_gen(): the generation new completion records go to (inlined into
-- the INSERT, as _gen is: no SET clause, volatile, every name qualified).
create or replace function pgque._done_gen()
returns integer language sql volatile
as $$
    select (coalesce(pg_catalog.pg_sequence_last_value('pgque.done_gen_seq'::pg_catalog.regclass), 0)
            operator(pg_catalog.%) 2)::integer
$$;

--   dn_sub     the subscription (plain or slot) the event is done for
--   dn_batch   the batch it was delivered in (what a flip keeps by)
--   dn_ev_id   the event
--   dn_gen     the generation (partition) the record lives in
create table if not exists pgque.event_done (
    dn_sub   integer not null,
    dn_batch bigint not null,
    dn_ev_id bigint not null,
    dn_gen   integer not null default pgque._done_gen()
) partition by list (dn_gen);
create table if not exists pgque.event_done_0 partition of pgque.event_done for values in (0);
create table if not exists pgque.event_done_1 partition of pgque.event_done for values in (1);
-- One record per (subscription, event) within a generation; writers
-- lock the whole table before they read the generation (_done_record), so
-- every record of a live batch is in the current generation and this index
-- alone refuses a second completion.
select pgque._create_index('event_done_key', $ddl$create unique index event_done_key
    on pgque.event_done (dn_sub, dn_ev_id, dn_gen)$ddl$);
