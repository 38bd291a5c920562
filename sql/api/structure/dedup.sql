-- Producer dedup storage.
--
-- A send with a dedup key records (queue, key, ev_id, time) in the current
-- of two generation tables, pgque.dedup_0 and pgque.dedup_1, shared by all
-- queues; lookups read both. Once the current generation is as old as the
-- longest dedup_window of any queue (plus a second), maint() truncates the
-- other one and makes it current: every record in it was written before the
-- current generation began, so it is past every queue's window. Storage is
-- append-only, holds at most about two of the longest windows of keys, and
-- is reclaimed by TRUNCATE: no record is updated or deleted on the send
-- path (the one exception: a key reused after its window while its old
-- record is still stored overwrites that record in place).
--
-- Two plain tables rather than partitions per queue: the send path reads
-- and writes them with static SQL, locks two relations however many queues
-- there are, and pays no tuple routing.

-- The generation state: which table is current, since when. One row,
-- written by rotation only.
create table if not exists pgque.dedup_state (
    singleton      boolean primary key default true check (singleton),
    ds_cur         integer not null default 0 check (ds_cur in (0, 1)),
    ds_switch_time timestamptz not null default now()
);
insert into pgque.dedup_state default values on conflict do nothing;

-- Per-queue window, for queues that set one (the others use 5 minutes).
-- Written by set_queue_config only.
create table if not exists pgque.queue_dedup (
    qd_queue  integer primary key references pgque.queue (queue_id) on delete cascade,
    qd_window interval not null default '5 minutes'
);

-- The two generations. The unique index makes a second inserter of a key
-- wait for the first and see its outcome; the send path also serialises
-- senders of one key with a transaction advisory lock.
create table if not exists pgque.dedup_0 (
    dd_queue integer not null,
    dd_key   text not null,
    dd_ev_id bigint not null,
    dd_time  timestamptz not null
);
select pgque._create_index('dedup_0_key_idx', $ddl$create unique index dedup_0_key_idx on pgque.dedup_0 (dd_queue, dd_key)$ddl$);
create table if not exists pgque.dedup_1 (
    dd_queue integer not null,
    dd_key   text not null,
    dd_ev_id bigint not null,
    dd_time  timestamptz not null
);
select pgque._create_index('dedup_1_key_idx', $ddl$create unique index dedup_1_key_idx on pgque.dedup_1 (dd_queue, dd_key)$ddl$);
