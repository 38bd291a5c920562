-- Maintenance: table rotation, and flips of the tick and state tables.
--
-- Rotation, in two steps. Step 1 waits until rotation_period has passed and
-- until the table that is to become current (the oldest) no longer holds an
-- event some subscription still needs; it then TRUNCATEs that table. Step 2,
-- in the same transaction, makes it the current table. The safety check is
-- done under an ACCESS EXCLUSIVE lock on that table: the lock waits for any
-- transaction still writing into it (a long producer from an earlier
-- rotation), and once it is held every row in the table is committed or
-- dead, so "no subscription's cursor is behind a row of this table" is a
-- plain, complete check. Rows below the oldest cursor's xmin are visible
-- to every cursor, so the check reads only the index range above it.
-- Space is only ever reclaimed by TRUNCATE; no event row is deleted. A
-- layer's 'rotate' hook can hold a table a while longer (_rotate_hold).

-- _lock_within(table, wait): takes an ACCESS EXCLUSIVE lock on a table,
-- waiting at most wait (not at all when wait is zero or less). Returns
-- false when the lock was not granted. Every lock maint() takes goes
-- through here, so that what one maint() call can be made to wait for is
-- bounded as a whole (see maint below), whoever holds the tables.
create or replace function pgque._lock_within(i_table text, i_wait interval)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_old_lt text := current_setting('lock_timeout');
begin
    if i_wait <= interval '0' then
        execute format('lock table %s in access exclusive mode nowait', i_table);
        return true;
    end if;
    perform set_config('lock_timeout', greatest(1, ceil(extract(epoch from i_wait) * 1000))::bigint || 'ms', true);
    execute format('lock table %s in access exclusive mode', i_table);
    perform set_config('lock_timeout', v_old_lt, true);
    return true;
exception when lock_not_available then
    perform set_config('lock_timeout', v_old_lt, true);
    return false;
end;
$$;

-- _maint_wait(cap, deadline): how long the next lock may wait: at most cap,
-- and no later than maint()'s deadline.
create or replace function pgque._maint_wait(i_cap interval, i_deadline timestamptz)
returns interval language sql volatile
set search_path = pg_catalog, pg_temp
as $$ select least(i_cap, i_deadline - clock_timestamp()) $$;

-- _rotate_pinners(queue_id, table_no): the subscriptions of the queue that
-- still need an event of its table table_no: an event (theirs, or shared)
-- their cursor's snapshot does not see yet. Reads each subscription's real
-- cursor (its newest state record), so a consumer that acknowledged
-- everything pins nothing. Rows below a cursor's xmin are visible to it,
-- so each probe reads only the index range above it. Complete only while
-- the table is locked (as _rotate holds it); rotation_blockers calls it
-- without the lock, to name who holds a rotation back.
create or replace function pgque._rotate_pinners(i_queue_id integer, i_table integer)
returns setof pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    return query execute format(
        'select s.* from pgque.subscription s
           cross join lateral pgque._sub_state(s.sub_id) st
           join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = st.st_last_tick
          where s.sub_queue = $1
            and exists (select 1 from %s e
                         where (e.ev_owner is null or e.ev_owner = s.sub_id)
                           and e.ev_txid >= pg_catalog.pg_snapshot_xmin(t.tick_snapshot)
                           and not pg_catalog.pg_visible_in_snapshot(e.ev_txid, t.tick_snapshot))
          order by s.sub_name', pgque._event_table(i_queue_id, i_table))
    using i_queue_id;
end;
$$;

-- _rotate(queue_id, deadline): rotates a queue's tables when due and safe,
-- waiting for locks no later than deadline. Returns 1 when rotated, 0
-- otherwise.
drop function if exists pgque._rotate(integer);
create or replace function pgque._rotate(i_queue_id integer, i_deadline timestamptz)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q        pgque.queue;
    v_next   integer;
    v_tbl    text;
begin
    -- A subscription being registered is invisible to the check below, yet
    -- the events committed after its starting tick are its to receive. It
    -- holds a key-share lock on the queue row until it commits: rotate
    -- later. The ticker holds the row briefly: rotate at the next maint().
    select * into q from pgque.queue where queue_id = i_queue_id for update skip locked;
    if not found or clock_timestamp() - q.queue_switch_time < q.queue_rotation_period then
        return 0;
    end if;
    v_next := (q.queue_cur_table + 1) % q.queue_ntables;
    v_tbl := pgque._event_table(q.queue_id, v_next);

    -- A subscription behind the table (the usual reason not to rotate)
    -- is found without the lock: a pinner seen now is one. Asking for the
    -- lock first made every reader of the queue's events (the ticker, the
    -- receives) queue behind the request, up to its wait, on each maint()
    -- while a consumer caught up, only to find the table still pinned.
    if exists (select 1 from pgque._rotate_pinners(q.queue_id, v_next)) then
        return 0;
    end if;
    -- Readers hold their locks only for a short transaction; wait a little,
    -- and try again at the next maint() if a writer is still in there.
    if not pgque._lock_within(v_tbl, pgque._maint_wait(interval '500 ms', i_deadline)) then
        return 0;
    end if;
    -- Under the lock every row of the table is committed or dead: the
    -- check is now complete (a writer that was still in the table may
    -- have committed a row no cursor has seen).
    if exists (select 1 from pgque._rotate_pinners(q.queue_id, v_next)) then
        return 0;
    end if;

    -- A layer may still need the table's rows (dedup keys within their
    -- window): rotate later.
    if pgque._rotate_hold(q.queue_id, v_next) is not null then
        return 0;
    end if;

    -- Step 1: reclaim the oldest table. Step 2: make it current, and note
    -- when the table it replaces stopped being written.
    execute format('truncate %s', v_tbl);
    update pgque.queue set queue_cur_table = v_next, queue_switch_time = clock_timestamp(),
                           queue_retired[q.queue_cur_table + 1] = clock_timestamp(),
                           queue_retired[v_next + 1] = null
     where queue_id = q.queue_id;
    return 1;
end;
$$;

-- Flips of the append-only state (see structure/state.sql). A flip of a
-- family (ticks or sub_state) takes an ACCESS EXCLUSIVE lock on its current
-- partition, then makes the other generation current: the lock waits for
-- every transaction still reading or writing the retired partition, and
-- once it is held every row in it is committed, so copying what is still
-- needed into the other partition (with a statement snapshot taken after
-- the lock) and truncating the retired one loses nothing. Writers that
-- picked the old generation before the switch wait for the lock and then
-- insert into the retired partition after the TRUNCATE: their rows are
-- kept there until the next flip. A flip waits at most 200 ms for the lock
-- and is retried at the next maint() otherwise; it is skipped (without
-- locking) when the current partition holds nothing but needed rows, so an
-- idle system costs a few index probes.

-- _flip_lock(table): locks a retired partition, waiting at most 200 ms.
-- Returns false when the lock was not granted.
create or replace function pgque._flip_lock(i_table text)
returns boolean language sql
set search_path = pg_catalog, pg_temp
as $$ select pgque._lock_within(i_table, interval '200 ms') $$;

-- _state_keep(gen): the newest record of every existing subscription, when
-- it lives in partition gen.
create or replace function pgque._state_keep(i_gen integer)
returns setof pgque.sub_state language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select st.*
      from pgque.subscription s
      cross join lateral (select * from pgque.sub_state x where x.st_sub = s.sub_id
                           order by x.st_seq desc limit 1) st
     where st.st_gen = i_gen
$$;

-- _state_flip_due(gen): whether partition gen of sub_state holds records
-- a flip would drop (more than the newest of each subscription).
create or replace function pgque._state_flip_due(i_gen integer)
returns boolean language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select (select count(*) from pgque.sub_state where st_gen = i_gen)
           > (select count(*) from pgque._state_keep(i_gen))
$$;

-- _state_flip(deadline): retires the current sub_state partition, keeping
-- the newest record of every existing subscription, waiting for its lock
-- no later than deadline. Returns 1 when flipped.
-- Tables: rotation (lock), sub_state (insert, truncate).
drop function if exists pgque._state_flip();
create or replace function pgque._state_flip(i_deadline timestamptz)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur integer;
begin
    -- Another maint() is flipping: it does this one's work.
    perform 1 from pgque.rotation where rot_name = 'state' for update skip locked;
    if not found then
        return 0;
    end if;
    v_cur := pgque._gen('state');
    if not pgque._state_flip_due(v_cur) then
        return 0;
    end if;
    if not pgque._lock_within('pgque.sub_state_' || v_cur, pgque._maint_wait(interval '200 ms', i_deadline)) then
        return 0;
    end if;
    perform nextval('pgque.state_gen_seq');
    insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                 st_acked_to, st_delivered_to, st_delivered_all, st_gen, st_moved)
    select k.st_sub, k.st_seq, k.st_time, k.st_last_tick, k.st_next_tick, k.st_batch,
           k.st_acked_to, k.st_delivered_to, k.st_delivered_all, 1 - v_cur, k.st_moved
      from pgque._state_keep(v_cur) k;
    execute format('truncate %s', 'pgque.sub_state_' || v_cur);
    return 1;
end;
$$;

-- _tick_keep(): per queue, the first tick still needed: its oldest cursor
-- (every open batch ends at a later tick), or its latest tick when nobody
-- subscribes. A subscription being registered is not visible yet but holds
-- a key-share lock on its queue row until it commits; so does nothing else
-- for long (the ticker's lock is short): such a queue keeps all its ticks.
-- With i_lock false nothing is locked and registrations are not seen: an
-- estimate, for deciding whether a flip is worth it.
drop function if exists pgque._tick_keep();
create or replace function pgque._tick_keep(i_lock boolean, out o_queue integer, out o_from bigint)
returns setof record language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    for o_queue in select queue_id from pgque.queue order by queue_id loop
        if i_lock then
            perform 1 from pgque.queue where queue_id = o_queue for update skip locked;
        end if;
        if i_lock and not found then
            o_from := 0;
        else
            select min(st.st_last_tick) into o_from
              from pgque.subscription s cross join lateral pgque._sub_state(s.sub_id) st
             where s.sub_queue = o_queue;
            if o_from is null then
                select max(tick_id) into o_from from pgque.tick where tick_queue = o_queue;
            end if;
        end if;
        return next;
    end loop;
end;
$$;

-- _tick_flip_due(gen): whether partition gen of tick holds ticks a flip
-- would drop (an estimate: registrations in progress are not seen).
create or replace function pgque._tick_flip_due(i_gen integer)
returns boolean language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select (select count(*) from pgque.tick where tick_gen = i_gen)
           > (select count(*) from pgque.tick t join pgque._tick_keep(false) k
                 on k.o_queue = t.tick_queue and t.tick_id >= k.o_from
              where t.tick_gen = i_gen)
$$;

-- _tick_flip(deadline): retires the current tick partition, keeping every
-- tick _tick_keep names, waiting for its lock no later than deadline.
-- Returns 1 when flipped.
-- Tables: rotation (lock), tick (insert, truncate).
drop function if exists pgque._tick_flip();
create or replace function pgque._tick_flip(i_deadline timestamptz)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur  integer;
begin
    perform 1 from pgque.rotation where rot_name = 'tick' for update skip locked;
    if not found then
        return 0;
    end if;
    v_cur := pgque._gen('tick');
    if not pgque._tick_flip_due(v_cur) then
        return 0;
    end if;
    if not pgque._lock_within('pgque.tick_' || v_cur, pgque._maint_wait(interval '200 ms', i_deadline)) then
        return 0;
    end if;
    perform nextval('pgque.tick_gen_seq');
    -- Statement snapshots from here on see every committed cursor.
    insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_xid, tick_gen)
    select t.tick_queue, t.tick_id, t.tick_time, t.tick_snapshot, t.tick_event_seq, t.tick_xid, 1 - v_cur
      from pgque.tick t join pgque._tick_keep(true) k on k.o_queue = t.tick_queue and t.tick_id >= k.o_from
     where t.tick_gen = v_cur;
    execute format('truncate %s', 'pgque.tick_' || v_cur);
    return 1;
end;
$$;

drop function if exists pgque._tick_cleanup(integer);

-- _maint_budget(): how long one maint() call may wait for locks in all.
create or replace function pgque._maint_budget()
returns interval language sql immutable
set search_path = pg_catalog, pg_temp
as $$ select interval '1 second' $$;

-- maint(): runs rotation for every queue, then the flips of the state log
-- and the ticks (last, so their exclusive locks are held only for the rest
-- of this transaction: a few milliseconds). Returns the
-- number of operations that did something. Like the ticker it refuses to
-- run under REPEATABLE READ or SERIALIZABLE: rotation's safety check must
-- see every transaction that committed before its table lock was granted,
-- and a transaction snapshot may predate them.
--
-- Any session that reads a table maint() truncates holds a lock on it
-- until its transaction ends, and a truncation must wait for it. One lock
-- waits at most 500 ms (rotation) or 200 ms (flips), and all of them
-- together at most one second (_maint_budget): past it, each lock is only
-- tried (NOWAIT), so sessions holding many queues' tables cannot make one
-- call last longer. What was skipped is retried at the next call;
-- rotation_blockers() names the sessions.
create or replace function pgque.maint()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id integer;
    v_n  integer := 0;
    v_deadline timestamptz := clock_timestamp() + pgque._maint_budget();
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('maint() must run in READ COMMITTED, not %s', current_setting('transaction_isolation'));
    end if;
    -- Before any lock is held (see _retire_event_index), and alone: once
    -- the index is dropped this transaction holds pgque.event's ACCESS
    -- EXCLUSIVE lock until it ends, and rotation and the flips below would
    -- wait for the state tables that consumers hold while they wait for
    -- pgque.event (a deadlock). They run at the next call.
    if pgque._retire_event_index() > 0 then
        return 1;
    end if;
    for v_id in select queue_id from pgque.queue order by queue_id loop
        v_n := v_n + pgque._rotate(v_id, v_deadline);
    end loop;
    -- State first: consumers read state before ticks, so taking the locks
    -- in the same order avoids lock cycles with them.
    v_n := v_n + pgque._state_flip(v_deadline);
    v_n := v_n + pgque._tick_flip(v_deadline);
    -- The upper layers' own maintenance (the api layer's dedup rotation).
    v_n := v_n + pgque._maint_hooks();
    return v_n;
end;
$$;
