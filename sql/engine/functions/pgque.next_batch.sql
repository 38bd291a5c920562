-- Batches.
--
-- next_batch opens the batch between a subscription's last tick and the
-- next tick; finish_batch moves the cursor to that next tick. A batch id
-- is nextval(batch_id_seq) * 2^20 + sub_id: the subscription is found from
-- the id alone, so subscription needs no index on sub_batch and its updates
-- stay HOT.

-- next_batch(queue, consumer): the open batch of the subscription, or a new
-- one if a later tick exists, or NULL. The subscription row is locked
-- (the receive lock): concurrent callers serialize and get the same batch.
-- Polls that find nothing write nothing.
create or replace function pgque.next_batch(i_queue text, i_consumer text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.subscription := pgque._subscription(i_queue, i_consumer);
    v_next bigint;
    v_batch bigint;
begin
    if s.sub_batch is null and not exists (
        select 1 from pgque.tick where tick_queue = s.sub_queue and tick_id > s.sub_last_tick) then
        return null;
    end if;
    select * into s from pgque.subscription where sub_id = s.sub_id for update;
    if s.sub_batch is not null then
        return s.sub_batch;
    end if;
    select tick_id into v_next from pgque.tick
     where tick_queue = s.sub_queue and tick_id > s.sub_last_tick
     order by tick_id limit 1;
    if not found then
        return null;
    end if;
    v_batch := nextval('pgque.batch_id_seq') * 1048576 + s.sub_id;
    update pgque.subscription
       set sub_batch = v_batch, sub_next_tick = v_next, sub_active = now()
     where sub_id = s.sub_id;
    return v_batch;
end;
$$;

-- _batch(batch_id): the open batch's subscription row, or PQ020.
create or replace function pgque._batch(i_batch_id bigint)
returns pgque.subscription language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    select * into s from pgque.subscription
     where sub_id = (i_batch_id % 1048576)::integer and sub_batch = i_batch_id;
    if not found then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    return s;
end;
$$;

-- finish_batch(batch_id): closes the batch and advances the cursor.
-- Returns 1; raises PQ020 when the batch is not open.
create or replace function pgque.finish_batch(i_batch_id bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    update pgque.subscription
       set sub_last_tick = sub_next_tick, sub_next_tick = null, sub_batch = null, sub_active = now()
     where sub_id = (i_batch_id % 1048576)::integer and sub_batch = i_batch_id;
    if not found then
        perform pgque._batch(i_batch_id);
    end if;
    return 1;
end;
$$;
