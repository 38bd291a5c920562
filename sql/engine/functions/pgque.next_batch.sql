-- Batches.
--
-- A batch is the events committed between two ticks of its queue: visible in
-- the last tick's snapshot and not in the first's. next_batch opens the batch
-- from a subscription's cursor (its last tick) to a later tick; finish_batch
-- moves the cursor to that later tick. Both append a sub_state record and
-- update nothing. A batch id is nextval(batch_id_seq) * 2^20 + sub_id: the
-- subscription is found from the id alone.

-- _batch_end(queue_id, last_tick, span, until): the last tick of a new
-- batch starting at last_tick, or NULL when no later tick exists up to
-- until (NULL: no bound). With span NULL it is the next tick (as PgQ's
-- next_batch). Otherwise a consumer that is behind takes several ticks at
-- once: the furthest tick (of the next 1000) whose recorded event sequence
-- is at most span past last_tick's, and at least the next tick, so a
-- backlog of small ticks is consumed in batches of about span events. A
-- sealed subscription passes its seal tick as until (an online resize of
-- slots seals the old ones): no batch of it ends past the seal.
-- Tables: tick (read). Generic plans only: the planner's custom plans for
-- the statement (the same index scans) were replanned on every call, and
-- planning cost more than running it (0.18 ms against 0.01 ms).
drop function if exists pgque._batch_end(integer, bigint, bigint);
create or replace function pgque._batch_end(i_queue integer, i_last_tick bigint, i_span bigint, i_until bigint)
returns bigint language plpgsql volatile
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
    v_next bigint;
    v_far  bigint;
begin
    -- One statement (every receive that opens a batch runs it): the next
    -- 1001 ticks once, the next of them, and the furthest within span.
    with c as (
        select tick_id, tick_event_seq from pgque.tick
         where tick_queue = i_queue and tick_id > i_last_tick
           and tick_id <= coalesce(i_until, 9223372036854775807)
         order by tick_id limit 1001)
    select (select min(c.tick_id) from c),
           case when i_span is not null then
               (select max(c.tick_id) from c
                 where c.tick_event_seq <= (select t.tick_event_seq from pgque.tick t
                                             where t.tick_queue = i_queue and t.tick_id = i_last_tick limit 1) + i_span)
           end
      into v_next, v_far;
    return coalesce(v_far, v_next);
end;
$$;

-- _open_batch(sub_id, queue_id, span): the open batch of the subscription,
-- or a new one if a later tick exists, or a NULL record. Takes the
-- subscription's lock (the receive lock): concurrent callers serialise and
-- get the same batch. A new batch ends where _batch_end(span) says: at the
-- next tick with span NULL (as PgQ's next_batch), further on for a
-- consumer that is behind. A sealed subscription (sub_until_tick set)
-- never opens a batch past its seal tick: it ends there, and whatever comes
-- later is another subscription's (an online resize of slots seals the old
-- ones). Polls that find nothing write nothing.
-- Returns the state record (st_batch, st_last_tick, st_next_tick, progress).
create or replace function pgque._open_batch(i_sub integer, i_queue integer, i_span bigint)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st      pgque.sub_state := pgque._sub_state(i_sub);
    v_next  bigint;
    v_until bigint := coalesce((select sub_until_tick from pgque.subscription where sub_id = i_sub),
                               9223372036854775807);
begin
    if st.st_batch is null and not exists (
        select 1 from pgque.tick where tick_queue = i_queue and tick_id > st.st_last_tick
                                   and tick_id <= v_until) then
        return null;
    end if;
    st := pgque._lock_sub(i_sub);
    if st.st_batch is not null then
        return st;
    end if;
    -- Read again under the lock: a seal committed while this call waited
    -- for it must bound the batch.
    v_until := (select sub_until_tick from pgque.subscription where sub_id = i_sub);
    v_next := pgque._batch_end(i_queue, st.st_last_tick, i_span, v_until);
    if v_next is null then
        return null;
    end if;
    st.st_next_tick := v_next;
    st.st_batch := pgque._batch_id(nextval('pgque.batch_id_seq'), i_sub);
    st.st_acked_to := null;
    st.st_delivered_to := null;
    st.st_delivered_all := false;
    return pgque._put_state(st);
end;
$$;

-- next_batch(queue, consumer): the open batch of the subscription, or a new
-- one ending at the next tick if one exists, or NULL (PgQ's next_batch).
-- Tables: sub_state (insert when a batch is opened), subscription (lock).
create or replace function pgque.next_batch(i_queue text, i_consumer text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._subscription(i_queue, i_consumer);
begin
    return (pgque._open_batch(s.sub_id, s.sub_queue, null)).st_batch;
end;
$$;

-- _batch(batch_id): the open batch's subscription row (with its current
-- state), or PQ020.
create or replace function pgque._batch(i_batch_id bigint)
returns pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    select * into s from pgque.subscription where sub_id = pgque._batch_sub(i_batch_id);
    s := pgque._with_state(s);
    if s.sub_batch is distinct from i_batch_id then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    return s;
end;
$$;

-- _finish(state): closes the state's open batch and moves the cursor to its
-- last tick (the caller holds _lock_sub).
create or replace function pgque._finish(st pgque.sub_state)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    st.st_last_tick := st.st_next_tick;
    st.st_next_tick := null;
    st.st_batch := null;
    st.st_acked_to := null;
    st.st_delivered_to := null;
    st.st_delivered_all := false;
    perform pgque._put_state(st);
end;
$$;

-- finish_batch(batch_id): closes the batch and advances the cursor.
-- Returns 1; raises PQ020 when the batch is not open.
-- Tables: sub_state (insert), subscription (lock).
create or replace function pgque.finish_batch(i_batch_id bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    st := pgque._lock_sub(pgque._batch_sub(i_batch_id));
    if st.st_batch is distinct from i_batch_id then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    perform pgque._finish(st);
    return 1;
end;
$$;
