-- Producer dedup storage.
--
-- A send with a dedup key stores the key in its own event row, in
-- pgque.event.ev_dedup, under a partial unique index on (ev_part,
-- ev_dedup): one key per event table, and no second row or table written
-- for it. The record's time is the event's ev_time (the start of the
-- sending transaction), and it lives as long as the event table: rotation
-- does not truncate a table that stopped being written less than a window
-- ago while it holds keys (the 'rotate' hook _dedup_rotate_hold), and
-- senders look into the tables retired within their window (rare: for one
-- window after each rotation). Sends without a key write NULL there and
-- no index entry.
--
-- A key reused after its window, while its expired row is still in the
-- current table, cannot be stored in the new row (the index holds one
-- row per key and table): that rare case is recorded in two generation
-- tables, pgque.dedup_0
-- and pgque.dedup_1, shared by all queues. Once the current generation is
-- as old as the longest dedup_window of any queue (plus a second), maint()
-- truncates the other one and makes it current: every record in it was
-- written before the current generation began, so it is past every
-- queue's window. These records are append-only too (the one exception: a
-- key reused again after its window overwrites its own record in place).

-- The generation state: which table is current, since when. One row,
-- written by rotation only.
create table if not exists pgque.dedup_state (
    singleton      boolean primary key default true check (singleton),
    ds_cur         integer not null default 0 check (ds_cur in (0, 1)),
    ds_switch_time timestamptz not null default now()
);
insert into pgque.dedup_state default values on conflict do nothing;

-- The two generations. The unique index makes a second inserter of a key
-- wait for the first and then see its record even where its snapshot
-- cannot (REPEATABLE READ): it is what serialises two senders reusing one
-- key (pgque.dedup.sql).
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

-- The upgrade from the layout that kept every key in dedup_0/1 and the
-- windows in a table pgque.queue_dedup of their own (the key column and
-- the window column are the engine's, added before this runs): each
-- window moves into its queue row, and the newest record of each key into
-- its event's row (at most one key per event table, so the unique index
-- holds); a record whose event is gone is left to expire.
do $dedup_in_events$
begin
    if to_regclass('pgque.queue_dedup') is not null then
        update pgque.queue q set queue_dedup_window = d.qd_window
          from pgque.queue_dedup d where d.qd_queue = q.queue_id;
        update pgque.event e set ev_dedup = r.dd_key
          from (select distinct on (dd_queue, dd_key) dd_queue, dd_key, dd_ev_id
                  from (select * from pgque.dedup_0 union all select * from pgque.dedup_1) a
                 order by dd_queue, dd_key, dd_time desc) r
         where e.ev_part >= pgque._part_lo(r.dd_queue) and e.ev_part < pgque._part_hi(r.dd_queue) and e.ev_id = r.dd_ev_id;
        drop table pgque.queue_dedup;
    end if;
end
$dedup_in_events$;
