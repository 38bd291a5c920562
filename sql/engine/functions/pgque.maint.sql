-- Maintenance: table rotation and tick clean-up.
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
-- Space is only ever reclaimed by TRUNCATE; no event row is deleted.

-- _rotate(queue_id): rotates a queue's tables when due and safe.
-- Returns 1 when rotated, 0 otherwise.
create or replace function pgque._rotate(i_queue_id integer)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q        pgque.queue;
    v_next   integer;
    v_tbl    text;
    v_xmin   xid8;
    v_pinned boolean;
    v_old_lt text := current_setting('lock_timeout');
begin
    select * into q from pgque.queue where queue_id = i_queue_id for no key update;
    if clock_timestamp() - q.queue_switch_time < q.queue_rotation_period then
        return 0;
    end if;
    -- A subscription being registered is invisible to the check below, yet
    -- the events committed after its starting tick are its to receive. It
    -- holds a key-share lock on the queue row until it commits: rotate later.
    perform 1 from pgque.queue where queue_id = i_queue_id for update skip locked;
    if not found then
        return 0;
    end if;
    v_next := (q.queue_cur_table + 1) % q.queue_ntables;
    v_tbl := pgque._event_table(q.queue_id, v_next);

    -- Readers hold their locks only for a short transaction; wait a little,
    -- and try again at the next maint() if a writer is still in there.
    begin
        perform set_config('lock_timeout', '500ms', true);
        execute format('lock table %s in access exclusive mode', v_tbl);
        perform set_config('lock_timeout', v_old_lt, true);
    exception when lock_not_available then
        perform set_config('lock_timeout', v_old_lt, true);
        return 0;
    end;

    select min(pg_snapshot_xmin(t.tick_snapshot)) into v_xmin
      from pgque.subscription s
      join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = s.sub_last_tick
     where s.sub_queue = q.queue_id;
    if v_xmin is not null then
        execute format(
            'select exists (select 1 from %s e
                             join pgque.subscription s on s.sub_queue = $1
                                  and (e.ev_owner is null or e.ev_owner = s.sub_id)
                             join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = s.sub_last_tick
                            where e.ev_txid >= $2
                              and not pg_catalog.pg_visible_in_snapshot(e.ev_txid, t.tick_snapshot))', v_tbl)
           into v_pinned using q.queue_id, v_xmin;
        if v_pinned then
            return 0;
        end if;
    end if;

    -- Step 1: reclaim the oldest table. Step 2: make it current.
    execute format('truncate %s', v_tbl);
    update pgque.queue set queue_cur_table = v_next, queue_switch_time = clock_timestamp()
     where queue_id = q.queue_id;
    return 1;
end;
$$;

-- _tick_cleanup(queue_id): deletes the ticks no subscription needs: those
-- before the oldest cursor (or all but the latest when nobody subscribes).
-- A subscription being registered is not visible yet but holds a key-share
-- lock on the queue row until it commits: the clean-up then skips the queue
-- until the next maint(), so the new subscription's starting tick survives.
-- Returns the number of ticks deleted.
create or replace function pgque._tick_cleanup(i_queue_id integer)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_keep bigint;
    v_n    integer;
begin
    perform 1 from pgque.queue where queue_id = i_queue_id for update skip locked;
    if not found then
        return 0;
    end if;
    select min(sub_last_tick) into v_keep from pgque.subscription where sub_queue = i_queue_id;
    if v_keep is null then
        select max(tick_id) into v_keep from pgque.tick where tick_queue = i_queue_id;
    end if;
    delete from pgque.tick where tick_queue = i_queue_id and tick_id < v_keep;
    get diagnostics v_n = row_count;
    return v_n;
end;
$$;

-- maint(): runs rotation and tick clean-up for every queue. Returns the
-- number of operations that did something. Like the ticker it refuses to
-- run under REPEATABLE READ or SERIALIZABLE: rotation's safety check must
-- see every transaction that committed before its table lock was granted,
-- and a transaction snapshot may predate them.
create or replace function pgque.maint()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id integer;
    v_n  integer := 0;
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('maint() must run in READ COMMITTED, not %s', current_setting('transaction_isolation'));
    end if;
    for v_id in select queue_id from pgque.queue order by queue_id loop
        v_n := v_n + pgque._rotate(v_id);
        if pgque._tick_cleanup(v_id) > 0 then
            v_n := v_n + 1;
        end if;
    end loop;
    -- The upper layers' own maintenance (the api layer's dedup rotation).
    v_n := v_n + pgque._maint_hooks();
    return v_n;
end;
$$;
