-- _event_tables_attach(queue_id): creates queue_id's event tables and
-- attaches them to pgque.event, each with its (ev_txid, ev_id) index,
-- unless they are attached already. A table of that name that is not a
-- partition of pgque.event is refused (XX000): only the owner of pgque
-- can make one, so it means a damaged install, not one to adopt.
--
-- Why a queue's tables are attached one create_queue ahead. Another
-- session may be building its cached partition descriptor of pgque.event
-- (its list of partitions, read once per invalidation) at the moment an
-- ATTACH commits: PostgreSQL reads pg_inherits under a catalog snapshot
-- taken before the commit, takes in the commit's invalidation halfway
-- through (at a catalog lock), and then caches the list it read. ATTACH
-- takes only SHARE UPDATE EXCLUSIVE on pgque.event, so nothing holds that
-- build back. The session keeps the list without the new tables until
-- the next invalidation of pgque.event, the next create_queue or
-- drop_queue: its sends to the new queue fail (23514, "no partition of
-- relation "event" found for row") and, worse, its receives, which read
-- batches through the parent, would find the queue's empty. Measured: 5
-- creates in 1900 with a ticker, consumers and senders beside them. So
-- create_queue attaches the tables of the queue it creates in an earlier
-- transaction than the one that makes the queue visible: each
-- create_queue, and the install, attach the tables of the next queue id
-- (_spare_queue_id) beside those of the queue they create. A descriptor
-- cached in a race then lacks only tables no queue uses yet, and the
-- create_queue that makes them a queue's replaces it: its invalidation is
-- queued as it commits, before its caller hears of the queue (only a
-- session that finds the queue in between, microseconds, and whose list
-- went stale at the previous create_queue, could miss it). A create_queue
-- whose tables are missing (the first after an install of an earlier
-- version; the next after one that rolled back, which took its id and
-- the spare with it, and left its own three empty tables to no queue)
-- attaches them itself, as before.
create or replace function pgque._event_tables_attach(i_queue_id integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_tbl text;
begin
    for v_n in 0 .. pgque._queue_ntables() - 1 loop
        v_tbl := pgque._event_table(i_queue_id, v_n);
        if pg_catalog.to_regclass(v_tbl) is null then
            -- Create standalone, then attach: ATTACH takes only a SHARE
            -- UPDATE EXCLUSIVE lock on pgque.event, so producers of other
            -- queues never wait for a queue being created. The new table
            -- is empty, so ATTACH has nothing to scan and needs no CHECK
            -- to skip the scan; a CHECK would cost every INSERT
            -- (structure/tables.sql).
            execute format('create table %s (like pgque.event including defaults)', v_tbl);
            execute format('alter table pgque.event attach partition %s for values in (%s)',
                           v_tbl, pgque._part(i_queue_id, v_n));
        elsif not exists (select from pg_catalog.pg_inherits
                           where inhrelid = v_tbl::regclass and inhparent = 'pgque.event'::regclass) then
            raise exception using errcode = 'XX000',
                message = format('%s exists but is not a partition of pgque.event: the install is damaged', v_tbl);
        end if;
        perform pgque._txid_index_build(i_queue_id, v_n);
    end loop;
end;
$$;

-- _queue_ntables(): the event tables of a queue (queue_ntables). Inlined.
create or replace function pgque._queue_ntables()
returns integer language sql immutable
return 3;

-- _spare_queue_id(): the id the next create_queue takes from
-- queue_id_seq (one past its last value once it was called).
create or replace function pgque._spare_queue_id()
returns integer language sql stable
set search_path = pg_catalog, pg_temp
as $$ select (case when is_called then last_value + 1 else last_value end)::integer from pgque.queue_id_seq $$;

-- create_queue(queue): creates a queue with its event sequence, its
-- queue_ntables event tables (attached to pgque.event as partitions) and a
-- first tick, so that consumers registered now start from a position.
-- Its tables were attached by the create_queue before it, or by the
-- install, and it attaches those of the next queue
-- (_event_tables_attach says why).
-- Returns 1 when created, 0 when the queue already existed.
-- Tables: queue, tick, event partitions.
create or replace function pgque.create_queue(i_queue text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id    integer;
    v_seq   text;
begin
    perform pgque._check_name('queue', i_queue);
    if i_queue ~ '[#/]' then
        raise exception using errcode = 'PQ010',
            message = format('invalid queue name %L: "#" and "/" are not allowed in queue names', i_queue);
    end if;
    -- Serialize queue creation so two callers cannot race on the name.
    -- A row lock on pgque.version, not an advisory lock: any role, even one
    -- without a pgque grant, can take an advisory lock and hold it.
    perform 1 from pgque.version for update;
    if exists (select 1 from pgque.queue where queue_name = i_queue) then
        return 0;
    end if;

    v_id := nextval('pgque.queue_id_seq');
    v_seq := 'pgque.' || quote_ident('event_seq_' || v_id);
    execute format('create sequence %s', v_seq);

    perform pgque._event_tables_attach(v_id);
    perform pgque._event_tables_attach(pgque._spare_queue_id());

    insert into pgque.queue (queue_id, queue_name, queue_ntables, queue_event_seq)
    values (v_id, i_queue, pgque._queue_ntables(), v_seq::regclass);

    -- The sequence is new: no event id is covered, so no transaction can
    -- hold one and any transaction id bounds them (tick_xid).
    insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_xid)
    values (v_id, nextval('pgque.tick_id_seq'), clock_timestamp(), pg_current_snapshot(), 0, pg_current_xact_id());
    return 1;
end;
$$;

-- _txid_indexes(table): the table's own valid indexes (not a partition of
-- an index of pgque.event, nor one a failed CREATE INDEX CONCURRENTLY
-- left) whose first two columns are ev_txid and ev_id.
-- Every event table has at least one: the readers of batches, the
-- ticker's straggler probe and the views need it. The engine builds
-- (ev_txid, ev_id), named by _txid_index_name; a layer may replace it by
-- an index with more columns after those two (the partition layer's
-- routing indexes).
create or replace function pgque._txid_indexes(i_table regclass)
returns text[] language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(array_agg(c.relname::text order by c.relname), '{}')
      from pg_catalog.pg_index i
      join pg_catalog.pg_class c on c.oid = i.indexrelid
     where i.indrelid = i_table and i.indnatts >= 2 and i.indisvalid
       and i.indkey[0] = (select a.attnum from pg_catalog.pg_attribute a where a.attrelid = i_table and a.attname = 'ev_txid')
       and i.indkey[1] = (select a.attnum from pg_catalog.pg_attribute a where a.attrelid = i_table and a.attname = 'ev_id')
       and not exists (select from pg_catalog.pg_inherits h where h.inhrelid = i.indexrelid)
$$;

-- _txid_index_name(queue_id, n): the name of the engine's (ev_txid, ev_id)
-- index of a queue's n-th event table.
create or replace function pgque._txid_index_name(i_queue_id integer, i_n integer)
returns text language sql immutable
as $$ select 'event_' operator(pg_catalog.||) i_queue_id::pg_catalog.text operator(pg_catalog.||) '_'
             operator(pg_catalog.||) i_n::pg_catalog.text operator(pg_catalog.||) '_txid' $$;

-- _txid_index_build(queue_id, n[, besides]): builds the engine's (ev_txid,
-- ev_id) index on a queue's n-th event table unless the table has an
-- index that leads with those columns already (_txid_indexes), not
-- counting the index named besides (one about to be dropped). A build
-- takes the table's SHARE lock: sends to it wait until the transaction
-- ends.
create or replace function pgque._txid_index_build(i_queue_id integer, i_n integer, i_besides text default null)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select from unnest(pgque._txid_indexes(pgque._event_table(i_queue_id, i_n)::regclass)) x
                    where x is distinct from i_besides) then
        execute format('create index %I on %s (ev_txid, ev_id)',
                       pgque._txid_index_name(i_queue_id, i_n), pgque._event_table(i_queue_id, i_n));
    end if;
end;
$$;

-- _retire_event_index(): drops the index of pgque.event that installs
-- before this one made, (ev_txid, ev_id) or before that (ev_txid), with
-- the copy it put on every table, once every event table has an index of
-- its own (the install builds them, _txid_index_build). It is not dropped
-- by the install: the drop needs pgque.event's ACCESS EXCLUSIVE lock, and
-- the install, holding the SHARE locks of its builds on the tables, would
-- wait for producers that wait for those tables: a deadlock (40P01 for
-- the sends), and an install that waits as long as any reader of
-- pgque.event stays. maint() calls it first, holding no lock yet, so the
-- lock order is pgque.event's then the tables', as a producer's is; the
-- lock is waited for at most 20 ms, and a call that does not get it
-- leaves the index to the next. A call that drops it ends maint() there,
-- so that its transaction takes no other lock while it holds
-- pgque.event's. Returns 1 when it dropped one.
create or replace function pgque._retire_event_index()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_old_lt text := current_setting('lock_timeout');
    v_ix text;
begin
    v_ix := coalesce(pg_catalog.to_regclass('pgque.event_txid_id_idx')::text, pg_catalog.to_regclass('pgque.event_txid_idx')::text);
    if v_ix is null then
        return 0;
    end if;
    if exists (select 1 from pg_catalog.pg_inherits h
                where h.inhparent = 'pgque.event'::regclass
                  and cardinality(pgque._txid_indexes(h.inhrelid::regclass)) = 0) then
        return 0;
    end if;
    begin
        perform set_config('lock_timeout', '20ms', true);
        -- IF EXISTS: another maint() may have dropped it while this one
        -- waited for the lock.
        execute format('drop index if exists %s', v_ix);
        perform set_config('lock_timeout', v_old_lt, true);
        return 1;
    exception when lock_not_available then
        perform set_config('lock_timeout', v_old_lt, true);
        return 0;
    end;
end;
$$;

-- Every event table gets an index of its own that leads with (ev_txid,
-- ev_id) where it has none: after an install of an earlier version, whose
-- index was pgque.event's (a build under the table's SHARE lock: sends to
-- it wait until the install commits), and after anything that left a
-- table without one. maint() then retires pgque.event's index
-- (_retire_event_index).
do $$
declare
    r record;
begin
    for r in select q.queue_id, t.n from pgque.queue q
               cross join lateral pg_catalog.generate_series(0, q.queue_ntables - 1) t(n)
              where pg_catalog.to_regclass(pgque._event_table(q.queue_id, t.n)) is not null
              order by 1, 2 loop
        perform pgque._txid_index_build(r.queue_id, r.n);
    end loop;
end;
$$;

-- The tables of the next queue (_event_tables_attach says why), under the
-- lock create_queue takes (no row yet on a first install, which no
-- create_queue can overlap).
do $$
begin
    perform 1 from pgque.version for update;
    perform pgque._event_tables_attach(pgque._spare_queue_id());
end;
$$;

-- _lock_holders(relations): the other sessions holding a lock on any of
-- them, as "pid N (role R)", for an error message.
create or replace function pgque._lock_holders(i_rels oid[])
returns text language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(string_agg(distinct format('pid %s (role %s)', l.pid, coalesce(a.usename::text, '?')), ', '), 'none now')
      from pg_catalog.pg_locks l left join pg_catalog.pg_stat_activity a on a.pid = l.pid
     where l.granted and l.locktype = 'relation' and l.database = (select oid from pg_catalog.pg_database where datname = current_database())
       and l.relation = any (i_rels) and l.pid <> pg_backend_pid()
$$;

-- drop_queue(queue[, force]): drops a queue, its event tables, ticks,
-- retries and dead letters. Refuses while consumers are subscribed unless
-- force is true. Detaching partitions needs a short exclusive lock on
-- pgque.event; it waits at most 5 seconds for producers to get out of the way.
-- The queue's own sequence and event tables are locked first, alone: a
-- wait for them (a producer of this queue finishing its transaction, or any
-- session that holds a lock on one of them, which a role may do without
-- the right to use them: nextval() locks a sequence before it checks the
-- privilege, PREPARE locks the tables it names) then holds up only this
-- queue's producers, not every producer behind the lock on pgque.event.
-- When they stay locked past 5 seconds it fails with 55P03 naming the
-- sessions that hold them, having dropped nothing. Then pgque.event's lock
-- is tried 20 ms at a time, 50 ms apart, for 5 seconds: every producer,
-- consumer and the ticker of every queue touch pgque.event, so while the
-- drop waits in its lock queue they all wait behind it, and one open
-- transaction that had read or written any queue held them all for the
-- whole 5 seconds of a single wait. Now each waits 20 ms at most per try;
-- when the lock does not come it fails the same way, naming the sessions
-- that hold pgque.event.
-- Returns 1.
create or replace function pgque.drop_queue(i_queue text, i_force boolean)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue;
    v_n   integer;
    v_sub text;
    v_old_lt text := current_setting('lock_timeout');
    v_until timestamptz;
begin
    q := pgque._queue(i_queue);
    select sub_name into v_sub from pgque.subscription where sub_queue = q.queue_id limit 1;
    if found and not coalesce(i_force, false) then
        raise exception using errcode = 'PQ011',
            message = format('queue %L still has consumers (for example %L); unsubscribe them or drop with force', i_queue, v_sub);
    end if;
    perform set_config('lock_timeout', '5s', true);
    begin
        execute format('drop sequence if exists %s', q.queue_event_seq);
        for v_n in 0 .. q.queue_ntables - 1 loop
            execute format('lock table %s in access exclusive mode', pgque._event_table(q.queue_id, v_n));
        end loop;
    exception when lock_not_available then
        raise exception using errcode = '55P03',
            message = format('queue %L is locked by other sessions (%s): drop_queue waited 5 s and dropped nothing; retry when they end',
                             i_queue, pgque._lock_holders(array[q.queue_event_seq::oid]
                                                          || array(select pgque._event_table(q.queue_id, n)::regclass::oid
                                                                     from generate_series(0, q.queue_ntables - 1) n)));
    end;
    v_until := clock_timestamp() + interval '5 seconds';
    loop
        begin
            perform set_config('lock_timeout', '20ms', true);
            lock table pgque.event in access exclusive mode;
            exit;
        exception when lock_not_available then
            if clock_timestamp() >= v_until then
                raise exception using errcode = '55P03',
                    message = format('pgque.event is locked by other sessions (%s): drop_queue of %L tried for 5 s and dropped nothing; '
                                     'retry when they end (a transaction left open after sending or receiving on any queue holds it)',
                                     pgque._lock_holders(array['pgque.event'::regclass::oid]), i_queue);
            end if;
            perform pg_sleep(0.05);
        end;
    end loop;
    perform set_config('lock_timeout', v_old_lt, true);
    for v_n in 0 .. q.queue_ntables - 1 loop
        execute format('drop table if exists %s', pgque._event_table(q.queue_id, v_n));
    end loop;
    delete from pgque.tick where tick_queue = q.queue_id;
    delete from pgque.queue where queue_id = q.queue_id;
    return 1;
end;
$$;

create or replace function pgque.drop_queue(i_queue text)
returns integer language sql security definer
set search_path = pg_catalog, pg_temp
as $$ select pgque.drop_queue(i_queue, false) $$;
