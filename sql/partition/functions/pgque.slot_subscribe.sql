-- Slots.
--
-- Slot k of N for consumer c is its own engine subscription "c#k/N" with
-- its own cursor, so slots never lose each other's events. Slot k receives
-- exactly the events whose partition key hashes to k (NULL keys: slot 0),
-- through the engine's extra_where hook.

-- _check_slot(slot, nslots): validates slot numbers (PQ011, 22004).
create or replace function pgque._check_slot(i_slot integer, i_nslots integer)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_slot is null or i_nslots is null then
        raise exception using errcode = '22004', message = 'slot and nslots must not be NULL';
    end if;
    if i_nslots < 1 or i_nslots > 1024 then
        raise exception using errcode = 'PQ011', message = format('nslots must be between 1 and 1024, not %s', i_nslots);
    end if;
    if i_slot < 0 or i_slot >= i_nslots then
        raise exception using errcode = 'PQ011',
            message = format('slot must be between 0 and %s for %s slots, not %s', i_nslots - 1, i_nslots, i_slot);
    end if;
end;
$$;

-- _slot_name(consumer, slot, nslots): the slot's subscription name. This
-- and _slot_filter are inlined into their callers' expressions (no SET
-- clause, so the planner may; every name qualified): every receive and
-- ack computes them, and a SQL function that is not inlined is planned
-- again at each call.
create or replace function pgque._slot_name(i_consumer text, i_slot integer, i_nslots integer)
returns text language sql immutable
as $$ select i_consumer operator(pg_catalog.||) '#' operator(pg_catalog.||) i_slot::pg_catalog.text
             operator(pg_catalog.||) '/' operator(pg_catalog.||) i_nslots::pg_catalog.text $$;

-- _check_slot_consumer(consumer, nslots): the names of every slot of
-- consumer fit the 63 bytes of a subscription name. A new slot consumer's
-- name may have at most 53 bytes, which leaves room for the longest suffix
-- ("#1023/1024") whatever N it is given now or resized to later, so that
-- one consumer never gets some of its slots and not others. A consumer
-- created before that limit keeps working as long as its names for N fit
-- (i_nslots; NULL checks the 53-byte limit of a new consumer). PQ010.
create or replace function pgque._check_slot_consumer(i_consumer text, i_nslots integer)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_longest text := pgque._slot_name(i_consumer, coalesce(i_nslots, 1024) - 1, coalesce(i_nslots, 1024));
begin
    if octet_length(v_longest) > 63 then
        raise exception using errcode = 'PQ010',
            message = format('slot consumer name %s… is %s bytes long; the limit is %s, so that every slot''s subscription name (up to %L) fits in 63 bytes',
                             quote_literal(left(i_consumer, 40)), octet_length(i_consumer),
                             63 - octet_length(v_longest) + octet_length(i_consumer),
                             '#' || (coalesce(i_nslots, 1024) - 1) || '/' || coalesce(i_nslots, 1024));
    end if;
end;
$$;

-- _slot_filter(slot, nslots): the routing predicate for extra_where, built
-- from two validated integers only; NULL (no filter) when nslots is 1.
create or replace function pgque._slot_filter(i_slot integer, i_nslots integer)
returns text language sql stable
as $$
    select case when i_nslots operator(pg_catalog.=) 1 then null else
        pg_catalog.format('(case when ev_extra1 is null then 0 else (pg_catalog.hashtextextended(ev_extra1, 0) %% %s + %s) %% %s end) = %s',
                          i_nslots::integer, i_nslots::integer, i_nslots::integer, i_slot::integer)
    end
$$;

-- _slot_of(key, nslots): slot_of without its checks, for pgque's own
-- callers that pass a validated N: an SQL-standard body, which the planner
-- inlines into the caller's statement (slot_of, PL/pgSQL with a SET
-- clause, costs a call per key). Not granted: slot_of, which roles call
-- with their own rights, keeps its own copy of the expression.
create or replace function pgque._slot_of(i_key text, i_nslots integer)
returns integer language sql immutable
return case when i_key is null then 0
            else ((pg_catalog.hashtextextended(i_key, 0) operator(pg_catalog.%) i_nslots operator(pg_catalog.+) i_nslots)
                  operator(pg_catalog.%) i_nslots)::integer end;

-- slot_of(key, nslots): the slot a partition key maps to (G1). Lets
-- operators and tests ask where a key goes. nslots is validated like
-- everywhere else (22004, PQ011).
create or replace function pgque.slot_of(i_key text, i_nslots integer)
returns integer language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_nslots is null then
        raise exception using errcode = '22004', message = 'nslots must not be NULL';
    end if;
    if i_nslots < 1 or i_nslots > 1024 then
        raise exception using errcode = 'PQ011', message = format('nslots must be between 1 and 1024, not %s', i_nslots);
    end if;
    return case when i_key is null then 0
                else ((hashtextextended(i_key, 0) % i_nslots + i_nslots) % i_nslots)::integer end;
end;
$$;

-- _slot_group(queue_id, consumer, nslots): checks N against the persisted
-- one, raising PQ030 on a mismatch and PQ034 when none is persisted.
create or replace function pgque._slot_group(i_queue text, i_consumer text, i_nslots integer)
returns pgque.slot_group language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    g pgque.slot_group;
begin
    select g1.* into g from pgque.slot_group g1 join pgque.queue q on q.queue_id = g1.sg_queue
     where q.queue_name = i_queue and g1.sg_consumer = i_consumer;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    if g.sg_nslots <> i_nslots then
        raise exception using errcode = 'PQ030',
            message = format('consumer %L on queue %L has %s slots, not %s', i_consumer, i_queue, g.sg_nslots, i_nslots);
    end if;
    return g;
end;
$$;

-- _index_ddl_lock(): whether this transaction holds, or now takes, the
-- right to build and drop event table indexes (maint_route_indexes) until
-- it ends: one session at a time, since two builds of one index at once
-- failed with 23505, and two sessions that each built and then retired an
-- engine index waited for each other's table (40P01). The right is the row
-- lock of pgque.index_ddl (no role can take it, unlike an advisory lock),
-- and it is only tried, never waited for: whoever does not get it (a
-- maint_route_indexes called by hand beside the ticker's) leaves the
-- indexes to the next call.
create or replace function pgque._index_ddl_lock()
returns boolean language sql
set search_path = pg_catalog, pg_temp
as $$ select exists (select from pgque.index_ddl for update skip locked) $$;

-- _route_index(queue_id, nslots, wanted): asks for (or, when no slot
-- group of the queue uses nslots any more, gives up) an index per event
-- table on ev_txid, ev_id and the routing expression for nslots
-- (_route_index_build). With it, slot k reads only its own events' rows
-- from the table instead of the whole stream's: N slots cost about one
-- reader, not N. The expression is spelled exactly as _slot_filter spells
-- it, so the planner matches the predicate to the index.
--
-- Every index slows every insert, so a queue has at most 4 distinct N with
-- an index (PQ051 beyond). The index itself is not built or dropped here:
-- building one holds the table's SHARE lock, dropping one its ACCESS
-- EXCLUSIVE lock, until the transaction ends, and a subscribe, unsubscribe
-- or resize runs in a transaction of the caller's, which a consumer role
-- may leave open for as long as it likes: every producer of the queue
-- waited for it. maint_route_indexes does the work in a transaction of its
-- own, and the notification asks the ticker for it once this transaction
-- commits (pgque_ticker, payload 'indexes': the ticker daemons run
-- maint_route_indexes at once, at most once a second, besides after every
-- maint()). Until then the group's slots read the tables through a filter
-- (correct, only slower).
create or replace function pgque._route_index(i_queue_id integer, i_nslots integer, i_wanted boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_distinct integer;
begin
    if i_nslots < 2 then
        return;
    end if;
    if not i_wanted and exists (select 1 from pgque.slot_group where sg_queue = i_queue_id
                                   and (sg_nslots = i_nslots or sg_resize_to = i_nslots)) then
        return;
    end if;
    if i_wanted then
        -- A resize in progress uses both its N.
        select count(distinct n) into v_distinct
          from (select sg_nslots from pgque.slot_group where sg_queue = i_queue_id
                union all
                select sg_resize_to from pgque.slot_group where sg_queue = i_queue_id) x(n)
         where n >= 2;
        if v_distinct > 4 then
            raise exception using errcode = 'PQ051',
                message = format('queue %s already has consumers with 4 different slot counts (N >= 2); '
                                 'use one of the N in use or remove a consumer first', (select queue_name from pgque.queue where queue_id = i_queue_id)),
                hint = 'every distinct N adds a routing index on each event table, which every producer maintains';
        end if;
    end if;
    -- As the ticks' wake-ups are, skipped past half a full NOTIFY queue
    -- (pg_notify fails on a full one): the indexes then come with the
    -- next maint().
    if pg_notification_queue_usage() < pgque._notify_max_usage() then
        perform pg_notify('pgque_ticker', 'indexes');
    end if;
end;
$$;

-- _route_index_build(queue_id, table, nslots): creates one routing index,
-- (ev_txid, ev_id, (routing expression)), then drops the engine's (ev_txid,
-- ev_id) index of the table (pgque._txid_index_build), whose work it does:
-- a batch is an ev_txid range, read in ev_id order, from either; slot k's
-- rows are those whose third column is k, tested on the index entry, so
-- only theirs are read from the table. A keyed send then writes one index
-- entry of 32 bytes where it wrote two (24 and 32): 72 bytes of WAL less
-- ("WAL per keyed send" in docs/benchmarks.md). An index of an earlier
-- version (the routing expression first, or without ev_id) is dropped and
-- built again. The engine's index goes through _txid_index_retire, which
-- does not wait for the table's lock while the build's SHARE lock is held
-- (_lock_for_index): when it is not granted at once, the table keeps both
-- indexes until a later maint_route_indexes call retires it.
create or replace function pgque._route_index_build(i_queue_id integer, i_table integer, i_nslots integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_ix text := 'event_' || i_queue_id || '_' || i_table || '_route' || i_nslots;
begin
    if pgque._route_index_old(v_ix) then
        execute format('drop index pgque.%I', v_ix);
    end if;
    execute format('create index if not exists %I on %s (ev_txid, ev_id, (%s))',
                   v_ix,
                   pgque._event_table(i_queue_id, i_table),
                   regexp_replace(pgque._slot_filter(0, i_nslots), ' = 0$', ''));
    perform pgque._txid_index_retire(i_queue_id, i_table);
end;
$$;

-- _lock_for_index(table, wait): takes an event table's ACCESS EXCLUSIVE
-- lock for an index change, waiting at most wait (_lock_within), and
-- reports whether it got it. A transaction that holds a lock on the table
-- stronger than ACCESS SHARE (the SHARE lock of an index it built there)
-- does not wait at all: that wait would upgrade its lock, and PostgreSQL
-- refuses at once, as a deadlock (40P01), a session that has read the
-- table and asks to write to it meanwhile (an ack that puts a paused
-- key's events back: its chunk was delivered again), or the upgrade
-- itself when that session asked first. It gets the lock at a later
-- call, holding none.
drop function if exists pgque._ddl_lock(regclass, text); -- its first name
create or replace function pgque._lock_for_index(i_tbl regclass, i_wait interval)
returns boolean language sql
set search_path = pg_catalog, pg_temp
as $$
    select pgque._lock_within(i_tbl::text,
        case when exists (select from pg_catalog.pg_locks l
                           where l.locktype = 'relation' and l.pid = pg_catalog.pg_backend_pid()
                             and l.relation = i_tbl and l.granted and l.mode <> 'AccessShareLock')
             then interval '0' else i_wait end)
$$;

-- _txid_index_retire(queue_id, table): drops the engine's (ev_txid, ev_id)
-- index of an event table where a routing index that a slot group uses
-- does its work. The table's ACCESS EXCLUSIVE lock comes first, waited
-- for at most 20 ms (a producer's transaction is shorter; a reader that
-- holds the table longer keeps both indexes until a later try), and not
-- at all right after a build (_lock_for_index), and only then is the
-- catalog read: a routing index dropped meanwhile by a session that saw
-- the engine's index cannot leave the table without either (index
-- changes are one session's at a time, _index_ddl_lock, but the catalog
-- is what holds the invariant). Returns whether it dropped it.
create or replace function pgque._txid_index_retire(i_queue_id integer, i_table integer)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_tbl text := pgque._event_table(i_queue_id, i_table);
    v_engine text := pgque._txid_index_name(i_queue_id, i_table);
begin
    -- Asked before the lock, so that a table with nothing to drop is not
    -- locked, and again under it.
    if not pgque._txid_index_replaced(i_queue_id, i_table) then
        return false;
    end if;
    if not pgque._lock_for_index(v_tbl::regclass, interval '20 ms') then
        return false;
    end if;
    if not pgque._txid_index_replaced(i_queue_id, i_table) then
        return false;
    end if;
    execute format('drop index pgque.%I', v_engine);
    return true;
end;
$$;

-- _txid_index_replaced(queue_id, table): whether the table has the
-- engine's (ev_txid, ev_id) index and a valid routing index of an N a slot
-- group of the queue uses.
create or replace function pgque._txid_index_replaced(i_queue_id integer, i_table integer)
returns boolean language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select pg_catalog.to_regclass(pg_catalog.format('pgque.%I', pgque._txid_index_name(i_queue_id, i_table))) is not null
       and exists (select 1 from unnest(pgque._txid_indexes(pgque._event_table(i_queue_id, i_table)::regclass)) x
                     cross join lateral pg_catalog.regexp_match(x, '^event_[0-9]+_[0-9]+_route([0-9]+)$') m
                    where m is not null
                      and exists (select 1 from pgque.slot_group g where g.sg_queue = i_queue_id
                                     and (g.sg_nslots = m[1]::integer or g.sg_resize_to = m[1]::integer)))
$$;

-- _route_index_old(index): whether the routing index exists in the shape
-- of an earlier version (the routing expression first, or without ev_id),
-- or invalid (a CREATE INDEX CONCURRENTLY that failed): to be built again.
create or replace function pgque._route_index_old(i_index text)
returns boolean language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select coalesce((select i.indnatts < 3 or i.indkey[0] = 0 or not i.indisvalid from pg_catalog.pg_index i
                      where i.indexrelid = pg_catalog.to_regclass(pg_catalog.format('pgque.%I', i_index))), false)
$$;

-- _route_index_drop(queue_id, table, index): drops a routing index no slot
-- group uses any more, keeping an index that leads with (ev_txid, ev_id)
-- on the table (_txid_indexes): when the routing index is the last one,
-- the engine's index is built first, on a table of at most 1000 rows; on a
-- fuller table the routing index stays, and maint_route_indexes drops it
-- once rotation has emptied the table. The table's ACCESS EXCLUSIVE lock
-- comes first, and the catalog is read under it: two sessions dropping
-- two routing indexes of one table each see what the other left (when
-- unsubscribes dropped them, two at once left a table with neither).
-- The lock is waited for at most 20 ms (_lock_for_index). Returns whether it
-- dropped it.
create or replace function pgque._route_index_drop(i_queue_id integer, i_table integer, i_index text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_tbl regclass := pgque._event_table(i_queue_id, i_table)::regclass;
    v_big boolean;
begin
    if pg_catalog.to_regclass(format('pgque.%I', i_index)) is null then
        return false;
    end if;
    if not pgque._lock_for_index(v_tbl, interval '20 ms') then
        return false;
    end if;
    if pg_catalog.to_regclass(format('pgque.%I', i_index)) is null then
        return false;
    end if;
    if not exists (select from unnest(pgque._txid_indexes(v_tbl)) x where x <> i_index) then
        execute format('select count(*) > 1000 from (select 1 from %s limit 1001) x', v_tbl) into v_big;
        if v_big then
            return false;
        end if;
        perform pgque._txid_index_build(i_queue_id, i_table, i_index);
    end if;
    execute format('drop index pgque.%I', i_index);
    return true;
end;
$$;

-- maint_route_indexes(): builds the routing indexes of the N that slot
-- groups use (_route_index), on the tables where building is cheap now: at
-- most 1000 rows, which rotation guarantees sooner or later, lock granted
-- within 100 ms, and drops those of an N no group uses any more. The
-- ticker daemons call it after every maint() and when a subscribe,
-- unsubscribe or resize asks (_route_index), and run_ticker after every
-- maint() (its 'maint_after' hook), each call a transaction of its own,
-- so the locks it takes last as long as the call. Returns how many
-- indexes it built or dropped.
-- Tables: slot_group (read), event tables (index).
create or replace function pgque.maint_route_indexes()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    r    record;
    v_big boolean;
    v_n  integer := 0;
    v_old_lt text := current_setting('lock_timeout');
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('maint_route_indexes() must run in READ COMMITTED, not %s', current_setting('transaction_isolation'));
    end if;
    if not pgque._index_ddl_lock() then
        return 0;
    end if;
    -- The readers of the N in use that a subscribe left to maintenance
    -- (_make_reader, api/functions/pgque.deliver_raw.sql).
    perform pgque._make_reader(g.sg_queue, g.n, false)
       from (select distinct sg_queue, n
               from pgque.slot_group cross join lateral (values (sg_nslots), (sg_resize_to)) v(n)
              where n is not null) g
      where pg_catalog.to_regproc(pg_catalog.format('pgque._read_%s_%s', g.sg_queue, g.n)) is null;
    for r in
        select g.sg_queue as queue_id, t.n, g.sg_nslots as nslots
          from (select distinct sg_queue, n as sg_nslots
                  from pgque.slot_group cross join lateral (values (sg_nslots), (sg_resize_to)) v(n)
                 where n >= 2) g
          join pgque.queue q on q.queue_id = g.sg_queue
          cross join lateral generate_series(0, q.queue_ntables - 1) t(n)
         where pg_catalog.to_regclass(pg_catalog.format('pgque.%I', 'event_' || g.sg_queue || '_' || t.n || '_route' || g.sg_nslots)) is null
            or pgque._route_index_old('event_' || g.sg_queue || '_' || t.n || '_route' || g.sg_nslots)
         order by 1, 2, 3
    loop
        execute format('select count(*) > 1000 from (select 1 from %s limit 1001) x', pgque._event_table(r.queue_id, r.n))
           into v_big;
        continue when v_big;
        begin
            perform set_config('lock_timeout', '100ms', true);
            perform pgque._route_index_build(r.queue_id, r.n, r.nslots);
            perform set_config('lock_timeout', v_old_lt, true);
            v_n := v_n + 1;
        exception when lock_not_available then
            perform set_config('lock_timeout', v_old_lt, true);
        end;
    end loop;
    -- Routing indexes of an N no slot group uses any more (the old N of a
    -- completed resize): dropped here rather than in the cutover, because
    -- the drop needs the table's exclusive lock, waited for at most 20 ms,
    -- and not at all on a table this call built on (_lock_for_index;
    -- _route_index_drop keeps an index that leads with (ev_txid, ev_id)):
    -- while a reader holds the table, each call stalls its producers that
    -- long, and the index stays until the reader is gone.
    for r in
        select c.relname, m[1]::integer as queue_id, m[2]::integer as tbl
          from pg_catalog.pg_class c
          join pg_catalog.pg_namespace ns on ns.oid = c.relnamespace and ns.nspname = 'pgque'
          cross join lateral pg_catalog.regexp_match(c.relname, '^event_([0-9]+)_([0-9]+)_route([0-9]+)$') m
         where c.relkind = 'i' and m is not null
           and not exists (select 1 from pgque.slot_group g where g.sg_queue = m[1]::integer
                              and (g.sg_nslots = m[3]::integer or g.sg_resize_to = m[3]::integer))
         order by 2, 3, 1
    loop
        if pgque._route_index_drop(r.queue_id, r.tbl, r.relname) then
            v_n := v_n + 1;
        end if;
    end loop;
    -- The engine's (ev_txid, ev_id) index of a table whose routing index
    -- does its work, which _route_index_build could not drop (the table's
    -- lock not granted at once): tried again at every call, waiting 20 ms
    -- at most each, and not at all on a table this call built on.
    for r in
        select q.queue_id, t.n
          from pgque.queue q
          cross join lateral generate_series(0, q.queue_ntables - 1) t(n)
         where pg_catalog.to_regclass(pg_catalog.format('pgque.%I', pgque._txid_index_name(q.queue_id, t.n))) is not null
           and exists (select 1 from pgque.slot_group g where g.sg_queue = q.queue_id)
         order by 1, 2
    loop
        if pgque._txid_index_retire(r.queue_id, r.n) then
            v_n := v_n + 1;
        end if;
    end loop;
    -- A table left with no index that leads with (ev_txid, ev_id) gets the
    -- engine's, where a build is cheap (as above).
    for r in
        select q.queue_id, t.n
          from pgque.queue q
          cross join lateral generate_series(0, q.queue_ntables - 1) t(n)
         where cardinality(pgque._txid_indexes(pgque._event_table(q.queue_id, t.n)::regclass)) = 0
         order by 1, 2
    loop
        execute format('select count(*) > 1000 from (select 1 from %s limit 1001) x', pgque._event_table(r.queue_id, r.n))
           into v_big;
        continue when v_big;
        begin
            perform set_config('lock_timeout', '100ms', true);
            perform pgque._txid_index_build(r.queue_id, r.n);
            perform set_config('lock_timeout', v_old_lt, true);
            v_n := v_n + 1;
        exception when lock_not_available then
            perform set_config('lock_timeout', v_old_lt, true);
        end;
    end loop;
    return v_n;
end;
$$;

-- subscribe_slot(queue, consumer, slot, nslots, policy): subscribes one
-- slot, setting the failure policy ('skip' or 'pause') when the consumer's
-- first slot is created; NULL keeps the persisted one (skip by default). A different
-- policy for an existing consumer raises PQ031: use set_failure_policy.
--
-- The slot group's row is locked (FOR NO KEY UPDATE: a lease row's
-- foreign key check, FOR KEY SHARE, does not wait for it) so that the
-- group's subscribes and unsubscribes go one at a time; the wait for it is
-- bounded (lock_timeout 2 s, then 55P03, retryable) because any role that
-- may consume the queue can call these and leave its transaction open. A
-- slot that is already subscribed as asked (every worker subscribes its
-- slots when it starts) returns 0 without the lock.
create or replace function pgque.subscribe_slot(i_queue text, i_consumer text, i_slot integer, i_nslots integer,
                                                i_policy text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
declare
    q     pgque.queue := pgque._queue(i_queue);
    g     pgque.slot_group;
    v_new integer;
    v_sub integer;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_consumer(i_consumer);
    perform pgque._check_slot(i_slot, i_nslots);
    perform pgque._check_slot_consumer(i_consumer,
        (select sg_nslots from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer));
    if i_policy is not null and i_policy not in ('skip', 'pause') then
        raise exception using errcode = 'PQ011',
            message = format('failure policy must be ''skip'' or ''pause'', not %L', i_policy);
    end if;
    if exists (select 1 from pgque.slot_group g1
                 join pgque.slot_lease l on l.sl_queue = g1.sg_queue and l.sl_consumer = g1.sg_consumer
                where g1.sg_queue = q.queue_id and g1.sg_consumer = i_consumer and l.sl_slot = i_slot
                  and g1.sg_nslots = i_nslots and (i_policy is null or g1.sg_policy = i_policy)) then
        return 0; -- already subscribed as asked
    end if;
    insert into pgque.slot_group (sg_queue, sg_consumer, sg_nslots, sg_policy)
    values (q.queue_id, i_consumer, i_nslots, coalesce(i_policy, 'skip'))
    on conflict do nothing;
    if found then
        perform pgque._make_reader(q.queue_id, i_nslots, false); -- see api/functions/pgque.deliver_raw.sql
        perform pgque._make_slot_keys(q.queue_id, false); -- see pgque.tick_slots.sql, "Key readers"
        perform pgque._route_index(q.queue_id, i_nslots, true);
    end if;
    perform 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer for no key update;
    g := pgque._slot_group(i_queue, i_consumer, i_nslots);
    if i_policy is not null and g.sg_policy <> i_policy then
        raise exception using errcode = 'PQ031',
            message = format('consumer %L on queue %L has failure policy %s, not %s; use set_failure_policy',
                             i_consumer, i_queue, g.sg_policy, i_policy);
    end if;

    v_new := pgque.register_consumer(i_queue, pgque._slot_name(i_consumer, i_slot, i_nslots));
    select sub_id into v_sub from pgque.subscription
     where sub_queue = q.queue_id and sub_name = pgque._slot_name(i_consumer, i_slot, i_nslots);
    insert into pgque.slot_lease (sl_queue, sl_consumer, sl_slot, sl_sub)
    values (q.queue_id, i_consumer, i_slot, v_sub)
    on conflict do nothing;
    return v_new;
end;
$$;

-- subscribe_slot(queue, consumer, slot, nslots): subscribes one slot.
-- Persists N for (queue, consumer) with the first slot; another N raises
-- PQ030. Idempotent. Returns 1 when the slot is new, 0 when it existed.
create or replace function pgque.subscribe_slot(i_queue text, i_consumer text, i_slot integer, i_nslots integer)
returns integer language sql security definer
set search_path = pg_catalog, pg_temp
as $$ select pgque.subscribe_slot(i_queue, i_consumer, i_slot, i_nslots, null) $$;

-- unsubscribe_slot(queue, consumer, slot, nslots): removes one slot with
-- its subscription, lease, open batch and retries. When the last slot goes,
-- N is released. Returns 1 when removed, 0 when it was not subscribed.
-- Locks the group's row as subscribe_slot does, with the same bounded wait.
create or replace function pgque.unsubscribe_slot(i_queue text, i_consumer text, i_slot integer, i_nslots integer)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_consumer(i_consumer);
    perform pgque._check_slot(i_slot, i_nslots);
    perform 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer for no key update;
    if not found then
        return 0;
    end if;
    perform pgque._slot_group(i_queue, i_consumer, i_nslots);
    if exists (select 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer
                                                 and sg_resize_to is not null) then
        raise exception using errcode = 'PQ073',
            message = format('consumer %L on queue %L is being resized; unsubscribe once the resize completed',
                             i_consumer, i_queue);
    end if;
    delete from pgque.subscription
     where sub_queue = q.queue_id and sub_name = pgque._slot_name(i_consumer, i_slot, i_nslots);
    if not found then
        return 0;
    end if;
    delete from pgque.slot_group g
     where g.sg_queue = q.queue_id and g.sg_consumer = i_consumer
       and not exists (select 1 from pgque.slot_lease l
                        where l.sl_queue = g.sg_queue and l.sl_consumer = g.sg_consumer);
    if found then
        perform pgque._route_index(q.queue_id, i_nslots, false);
    end if;
    return 1;
end;
$$;

-- run_ticker (pg_cron) runs maint_route_indexes in a transaction of its
-- own after maint(), as the ticker daemons do.
insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint_after', 'route_indexes', 'pgque.maint_route_indexes()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;
