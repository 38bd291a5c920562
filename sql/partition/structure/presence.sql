-- Worker presence: which worker processes of a partitioned consumer are
-- alive, which slots they work, and whether they want more ("hungry").
--
-- Pools used to tell each other this by NOTIFY alone, but any role of the
-- cluster may LISTEN (reading queue names and worker ids) and NOTIFY
-- (forging hungry workers, so real pools give slots up). Presence is
-- therefore kept here, written and read only through announce_worker;
-- NOTIFY on the presence channel is a wake-up hint whose payload nobody
-- trusts.
--
-- Every pool announces itself once per claim pass (about once a second), so
-- presence is written as often as anything in pgque. It is kept like the
-- subscription state (engine/structure/state.sql): records are only ever
-- INSERTed, into two generations of a table list-partitioned by wp_gen; a
-- worker's presence is its newest record. maint() (through the
-- 'presence_flip' layer hook) copies each worker's newest record heard from
-- in the last 10 minutes into the other generation and TRUNCATEs the
-- retired one. A held xmin horizon therefore leaves no dead row versions
-- behind, however long it is held, and the table holds about one maint
-- interval of announcements.

-- Installs before the append-only presence kept one row per worker,
-- updated in place. Presence is soft state (pools announce again within a
-- second), so the old table is dropped rather than migrated.
do $presence$
begin
    if exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'pgque' and c.relname = 'worker_presence' and c.relkind = 'r') then
        drop table pgque.worker_presence;
    end if;
end
$presence$;

-- The generation new records go to: presence_gen_seq's value modulo 2 (a
-- sequence changes in place, so moving it makes no row version).
create sequence if not exists pgque.presence_gen_seq;

-- presence_rotation: one row, never updated; a flip locks it so that two
-- maint() calls never flip presence at once.
create table if not exists pgque.presence_rotation (
    singleton boolean primary key default true check (singleton)
);
insert into pgque.presence_rotation default values on conflict do nothing;

-- _presence_gen(): the generation new presence records go to (inlined
-- into the INSERT, as _gen is: no SET clause, volatile, every name
-- qualified).
create or replace function pgque._presence_gen()
returns integer language sql volatile
as $$
    select (coalesce(pg_catalog.pg_sequence_last_value('pgque.presence_gen_seq'::pg_catalog.regclass), 0)
            operator(pg_catalog.%) 2)::integer
$$;

--   wp_queue, wp_consumer, wp_worker  who (queue id, consumer name, worker id)
--   wp_hungry   the worker wants more slots
--   wp_slots    the slots it works
--   wp_seen     when it announced itself (clock_timestamp)
--   wp_gen      the generation (partition) the record lives in
create table if not exists pgque.worker_presence (
    wp_queue    integer not null,
    wp_consumer text not null,
    wp_worker   text not null,
    wp_hungry   boolean not null,
    wp_slots    integer[] not null,
    wp_seen     timestamptz not null,
    wp_gen      integer not null default pgque._presence_gen()
) partition by list (wp_gen);
create table if not exists pgque.worker_presence_0 partition of pgque.worker_presence for values in (0);
create table if not exists pgque.worker_presence_1 partition of pgque.worker_presence for values in (1);
-- Serves both "the next worker after w" (the skip scan in announce_worker)
-- and "w's newest record".
select pgque._create_index('worker_presence_worker_idx', $ddl$create index worker_presence_worker_idx
    on pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_seen desc)$ddl$);
