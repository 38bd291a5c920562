-- Engine tables.
--
-- Event storage is one list-partitioned table, pgque.event: every queue owns
-- a fixed number (queue_ntables, 3) of partitions used round-robin, named
-- event_<queue_id>_<n> and holding ev_part = queue_id * 16 + n. Producers
-- only ever INSERT into it; rotation reclaims space by TRUNCATE of a whole
-- partition. No row of an event table is ever updated or deleted.
--
-- Nothing is updated or deleted per tick, batch or chunk: the subscription
-- row is a static anchor (locked, never updated, while consuming) and the
-- state that moves is appended to pgque.sub_state (see structure/state.sql).

create table if not exists pgque.version (
    singleton    boolean primary key default true check (singleton),
    version      text not null,
    installed_at timestamptz not null default now()
);

create table if not exists pgque.queue (
    queue_id                 integer primary key,
    queue_name               text not null unique,
    queue_ntables            integer not null default 3,
    queue_cur_table          integer not null default 0,
    queue_event_seq          regclass not null,
    queue_rotation_period    interval not null default '2 hours',
    queue_switch_time        timestamptz not null default now(),
    queue_ticker_max_count   integer not null default 500,
    queue_ticker_max_lag     interval not null default '10 milliseconds',
    queue_ticker_idle_period interval not null default '60 seconds',
    queue_max_retries        integer not null default 5,
    queue_created            timestamptz not null default now()
);

create sequence if not exists pgque.queue_id_seq;
create sequence if not exists pgque.tick_id_seq;
create sequence if not exists pgque.batch_id_seq;
create sequence if not exists pgque.subscription_id_seq maxvalue 1048575;
-- Subscription ids are 20 bits (batch ids embed them) and are reused: the
-- sequence cycles (register_consumer skips ids still in use).
do $cycle$
begin
    if not (select seqcycle from pg_catalog.pg_sequence where seqrelid = 'pgque.subscription_id_seq'::regclass) then
        alter sequence pgque.subscription_id_seq cycle;
    end if;
end
$cycle$;

-- The parent of every queue's event tables. ev_txid is the producing
-- transaction; batches are cut by comparing it with tick snapshots.
create table if not exists pgque.event (
    ev_id     bigint not null,
    ev_time   timestamptz not null default now(),
    ev_txid   xid8 not null default pg_current_xact_id(),
    ev_part   integer not null,
    ev_owner  integer,
    ev_retry  integer,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text
) partition by list (ev_part);

-- Each event table has an index of its own that leads with (ev_txid, ev_id)
-- (a batch is its ev_txid ranges, and ev_id, its order, in the index lets
-- a chunk of a large batch be read from the index alone: "Large batches"
-- in docs/design.md). It is not an index of pgque.event, which every
-- partition would have to carry: a table that slot consumers read carries
-- the same two columns with its routing expression after them instead, one
-- index where there were two (see "Event storage" in docs/design.md and
-- pgque._txid_index_build in functions/pgque.create_queue.sql, which also
-- moves the indexes of earlier versions, made on pgque.event, onto the
-- tables).

-- ev_dedup: an idempotency key, unique within an event table (the
-- partial index holds no entry for the NULL of an event without one).
-- The api layer's dedup keys live here (api/structure/dedup.sql): a keyed
-- send writes its key into its own event row, and that index is the
-- lookup.
select pgque._add_column('pgque.event', 'ev_dedup', $ddl$alter table pgque.event add column ev_dedup text$ddl$);
select pgque._create_index('event_dedup_idx',
    $ddl$create unique index event_dedup_idx on pgque.event (ev_part, ev_dedup) where ev_dedup is not null$ddl$);

-- Earlier versions gave every partition a CHECK (ev_part = n) so that
-- ATTACH PARTITION would not scan it. The partition constraint says the
-- same, and a CHECK costs every INSERT a parse and plan of its expression
-- (about 6% of a send's server instructions), so it is dropped.
do $drop_part_checks$
declare
    c record;
begin
    for c in select con.conrelid::regclass as tbl, con.conname
               from pg_catalog.pg_constraint con
               join pg_catalog.pg_inherits i on i.inhrelid = con.conrelid
              where i.inhparent = 'pgque.event'::regclass and con.contype = 'c'
                and con.conname like 'event\_%\_part'
    loop
        execute format('alter table %s drop constraint %I', c.tbl, c.conname);
    end loop;
end
$drop_part_checks$;

-- Ticks (pgque.tick) and the delivery state log (pgque.sub_state) live in
-- structure/state.sql: both are append-only and reclaimed by TRUNCATE.

-- A subscription is (queue, consumer): a static row, locked while its state
-- changes but never updated. sub_last_tick is its cursor at registration;
-- sub_next_tick, sub_batch and sub_active are only read once, by the
-- install that moves state written in place by earlier versions into
-- pgque.sub_state. The current cursor and open batch are the
-- subscription's newest sub_state record. Batch ids embed
-- sub_id in their low 20 bits, so a batch's subscription is found from the
-- id alone.
create table if not exists pgque.subscription (
    sub_id         integer primary key,
    sub_queue      integer not null references pgque.queue (queue_id) on delete cascade,
    sub_name       text not null,
    sub_last_tick  bigint not null,
    sub_next_tick  bigint,
    sub_batch      bigint,
    sub_active     timestamptz not null default now(),
    sub_registered timestamptz not null default now(),
    unique (sub_queue, sub_name)
) with (fillfactor = 50);

-- queue_retired[n + 1]: when table n last stopped being current (NULL
-- while it is current, and for a table never current since this column
-- exists). Written by rotation only, with queue_switch_time, which is
-- therefore the newest of these times. Every row of a retired table was
-- written by a transaction that began before that time: a layer that must
-- keep a table's rows for a while after its last write (the dedup keys of
-- the api layer) reads its age from here (see the 'rotate' hooks).
select pgque._add_column('pgque.queue', 'queue_retired', $ddl$alter table pgque.queue add column queue_retired timestamptz[]$ddl$);

-- queue_dedup_window: how long the queue remembers a dedup key (NULL: 5
-- minutes). Set through set_queue_config(queue, 'dedup_window', ...) by
-- the api layer, which gives it its meaning; kept in the queue row, which
-- every send reads anyway.
select pgque._add_column('pgque.queue', 'queue_dedup_window', $ddl$alter table pgque.queue add column queue_dedup_window interval$ddl$);

-- sub_until_tick: when set, the subscription is sealed at that tick and
-- never opens a batch past it (see _open_batch). Written once per online
-- resize of a slot group, never while consuming.
select pgque._add_column('pgque.subscription', 'sub_until_tick', $ddl$alter table pgque.subscription add column sub_until_tick bigint$ddl$);

-- Events set aside by event_retry until ev_retry_after, for one subscription.
create table if not exists pgque.retry_queue (
    ev_owner       integer not null references pgque.subscription (sub_id) on delete cascade,
    ev_id          bigint not null,
    ev_queue       integer not null,
    ev_retry_after timestamptz not null,
    ev_time        timestamptz not null,
    ev_retry       integer not null,
    ev_type        text,
    ev_data        text,
    ev_extra1      text,
    ev_extra2      text,
    ev_extra3      text,
    ev_extra4      text,
    primary key (ev_owner, ev_id)
);
select pgque._create_index('retry_queue_due_idx', $ddl$create index retry_queue_due_idx on pgque.retry_queue (ev_retry_after)$ddl$);

-- Events that failed more than the queue's max_retries times.
create table if not exists pgque.dead_letter (
    dl_id       bigint generated always as identity primary key,
    dl_queue    integer not null references pgque.queue (queue_id) on delete cascade,
    dl_consumer text not null,
    dl_time     timestamptz not null default now(),
    dl_reason   text,
    ev_id       bigint not null,
    ev_time     timestamptz not null,
    ev_txid     xid8,
    ev_retry    integer not null,
    ev_type     text,
    ev_data     text,
    ev_extra1   text,
    ev_extra2   text,
    ev_extra3   text,
    ev_extra4   text
);
select pgque._create_index('dead_letter_consumer_idx', $ddl$create index dead_letter_consumer_idx on pgque.dead_letter (dl_queue, dl_consumer, dl_id)$ddl$);

-- The single ticker lease: whichever ticker daemon holds it ticks. The
-- row changes only when its owner does (a takeover, a resignation), so that
-- a held xmin horizon does not pile up a dead version per renewal:
-- lease_until is the expiry the claim set, and a renewal moves
-- ticker_beat_seq to the renewed expiry in milliseconds since 1970 (a
-- sequence changes in place and makes no row version). The lease lives
-- until the later of the two (_ticker_expiry).
create table if not exists pgque.ticker_lease (
    singleton   boolean primary key default true check (singleton),
    owner       text,
    lease_until timestamptz,
    epoch       bigint not null default 0
);
create sequence if not exists pgque.ticker_beat_seq;

-- Events set aside by event_defer for one subscription, in groups, without
-- counting a retry. event_undefer puts a group back into the log (same
-- ev_id, same ev_retry) where only that subscription sees it, so a group is
-- re-delivered in ev_id order. Rows exist only while deferred; nothing here
-- is written for events that are never deferred.
create table if not exists pgque.deferred (
    ev_owner    integer not null references pgque.subscription (sub_id) on delete cascade,
    ev_id       bigint not null,
    ev_group    text not null,
    ev_queue    integer not null,
    ev_time     timestamptz not null,
    ev_retry    integer,
    ev_type     text,
    ev_data     text,
    ev_extra1   text,
    ev_extra2   text,
    ev_extra3   text,
    ev_extra4   text,
    deferred_at timestamptz not null default now(),
    primary key (ev_owner, ev_id)
);
select pgque._create_index('deferred_group_idx', $ddl$create index deferred_group_idx on pgque.deferred (ev_owner, ev_group, ev_id)$ddl$);

-- Hooks by which the layers above the engine add their own per-queue
-- settings and maintenance without the engine knowing what they are:
-- set_queue_config hands a parameter it does not know to the 'queue_config'
-- hook of that name, called as fn(queue_id integer, value text); maint()
-- calls every 'maint' hook as fn() returning integer (operations done);
-- run_ticker calls every 'maint_after' hook as fn() returning integer in
-- a transaction of its own after maint()'s (work whose locks must not
-- outlast the call: the ticker daemons make the same calls themselves);
-- rotation asks every 'rotate' hook, as fn(queue_id integer, table_no
-- integer) returning text, whether it may truncate that table (NULL: yes;
-- otherwise why not); the ticker calls every 'tick' hook, as fn(queue_id
-- integer, tick_id bigint), in the transaction that wrote the tick, just
-- after writing it. Written only by the install; the functions named are
-- the owner's.
create table if not exists pgque.layer_hook (
    hook_kind text not null check (hook_kind in ('queue_config', 'maint', 'rotate', 'tick', 'maint_after')),
    hook_name text not null,
    hook_fn   regprocedure not null,
    primary key (hook_kind, hook_name)
);

-- The 'rotate', 'tick' and 'maint_after' hook kinds are newer than the
-- table: widen the check of an older install (only then: ALTER TABLE locks
-- the table).
do $hook_kinds$
begin
    if not exists (select 1 from pg_catalog.pg_constraint
                    where conrelid = 'pgque.layer_hook'::regclass and contype = 'c'
                      and pg_catalog.pg_get_constraintdef(oid) like '%''maint_after''%') then
        alter table pgque.layer_hook drop constraint if exists layer_hook_hook_kind_check;
        alter table pgque.layer_hook add constraint layer_hook_hook_kind_check
            check (hook_kind in ('queue_config', 'maint', 'rotate', 'tick', 'maint_after'));
    end if;
end
$hook_kinds$;
