-- Producer dedup storage.
--
-- A send with a dedup key records (key, ev_id, time) in pgque.dedup. Each
-- queue owns two partitions, dedup_<queue_id>_0 and _1, holding
-- dd_part = queue_id * 2 + generation. New records go to the queue's current
-- generation (queue_dedup.qd_cur); lookups read both. Once the current
-- generation is a whole window old, maint() truncates the other one (every
-- record in it was written before the current generation began, so it is
-- past the window) and makes it current. So storage is append-only, holds
-- at most about two windows of keys, and is reclaimed by TRUNCATE: no
-- record is ever updated or deleted on the send path (the one exception: a
-- key reused after its window while its old record is still stored
-- overwrites that record in place).

-- Per-queue dedup state. One row per queue, written by set_queue_config
-- and by rotation (once per window), never by a send.
create table if not exists pgque.queue_dedup (
    qd_queue       integer primary key references pgque.queue (queue_id) on delete cascade,
    qd_window      interval not null default '5 minutes',
    qd_cur         integer not null default 0 check (qd_cur in (0, 1)),
    qd_switch_time timestamptz not null default now()
);

create table if not exists pgque.dedup (
    dd_part  integer not null,
    dd_key   text not null,
    dd_ev_id bigint not null,
    dd_time  timestamptz not null
) partition by list (dd_part);

-- The unique index makes a second inserter of the same key in the same
-- generation wait for the first and see its outcome; the send path also
-- serialises senders of one key with a transaction advisory lock, which
-- covers the two generations at once.
create unique index if not exists dedup_key_idx on pgque.dedup (dd_part, dd_key);
