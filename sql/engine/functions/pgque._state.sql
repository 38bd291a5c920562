-- Reading and appending subscription state (pgque.sub_state).
--
-- The current state of a subscription is its newest sub_state record
-- (register_consumer appends the first). Appending requires the
-- subscription row's lock (_lock_sub), so the newest record is always the
-- last one appended. None of these functions is granted to any role.
--
-- Every function that reads sub_state or tick is VOLATILE: a volatile
-- PL/pgSQL statement takes its table locks before its snapshot, so a
-- statement that waited for a flip's ACCESS EXCLUSIVE lock sees the rows
-- the flip copied. (A STABLE function reads with its caller's snapshot,
-- which may predate the flip: TRUNCATE is not MVCC-safe, and the retired
-- partition would look empty.)

-- _sub_state(sub_id): the subscription's current state. Tables:
-- sub_state, subscription (read). A NULL record when the subscription does
-- not exist. A subscription whose records are all invisible can only be
-- read by a transaction snapshot older than the last flip (REPEATABLE READ
-- or SERIALIZABLE): that is an error (PQ011), never an older state.
create or replace function pgque._sub_state(i_sub integer)
returns pgque.sub_state language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    select * into st from pgque.sub_state where st_sub = i_sub order by st_seq desc limit 1;
    -- Two tests, not one AND: "not found" folds the AND to false in a
    -- custom plan, so the plan cache would never settle on a generic plan
    -- and would plan the subquery at every call.
    if not found then
        if exists (select 1 from pgque.subscription where sub_id = i_sub) then
            raise exception using errcode = 'PQ011',
                message = format('the state of subscription %s is not visible to this transaction''s snapshot; consume in READ COMMITTED', i_sub);
        end if;
    end if;
    return st;
end;
$$;

-- _with_state(subscription): the subscription row with sub_last_tick,
-- sub_next_tick, sub_batch and sub_active taken from its current state.
create or replace function pgque._with_state(s pgque.subscription)
returns pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if s.sub_id is null then
        return s;
    end if;
    st := pgque._sub_state(s.sub_id);
    s.sub_last_tick := st.st_last_tick;
    s.sub_next_tick := st.st_next_tick;
    s.sub_batch := st.st_batch;
    s.sub_active := st.st_time;
    return s;
end;
$$;

-- _lock_sub(sub_id): takes the subscription row's lock, which serialises
-- every change of its state (the receive lock). FOR NO KEY UPDATE does not
-- conflict with the key-share locks foreign keys take (retry_queue,
-- deferred). Returns the current state, read after the lock was granted.
create or replace function pgque._lock_sub(i_sub integer)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform 1 from pgque.subscription where sub_id = i_sub for no key update;
    return pgque._sub_state(i_sub);
end;
$$;

-- _put_state(state): appends a state record (st_seq and st_gen are
-- assigned here; the caller holds _lock_sub). Returns the record.
create or replace function pgque._put_state(st pgque.sub_state)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    st.st_seq := nextval('pgque.sub_state_seq');
    st.st_time := clock_timestamp();
    st.st_moved := st.st_time;
    insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                 st_acked_to, st_delivered_to, st_delivered_all, st_moved)
    values (st.st_sub, st.st_seq, st.st_time, st.st_last_tick, st.st_next_tick, st.st_batch,
            st.st_acked_to, st.st_delivered_to, coalesce(st.st_delivered_all, false), st.st_moved);
    return st;
end;
$$;

-- _touch_state(sub_id): appends a copy of the current state with a new
-- st_time, for layers that keep time-bound facts (a heartbeat) in the
-- state's timestamp instead of updating a row. The copy keeps st_moved:
-- a heartbeat is not progress. Tables: sub_state (insert), subscription
-- (lock).
create or replace function pgque._touch_state(i_sub integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state := pgque._lock_sub(i_sub);
begin
    if st.st_sub is not null then
        insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                     st_acked_to, st_delivered_to, st_delivered_all, st_moved)
        values (st.st_sub, nextval('pgque.sub_state_seq'), clock_timestamp(), st.st_last_tick, st.st_next_tick,
                st.st_batch, st.st_acked_to, st.st_delivered_to, st.st_delivered_all,
                coalesce(st.st_moved, st.st_time));
    end if;
end;
$$;
