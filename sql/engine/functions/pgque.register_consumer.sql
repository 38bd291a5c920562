-- register_consumer(queue, consumer): subscribes consumer to queue. The new
-- subscription starts at the queue's latest tick: it receives the events
-- committed after that tick. Returns 1 when new, 0 when it existed.
-- Raises PQ050 when no subscription id is free.
-- Tables: subscription, sub_state (insert).
create or replace function pgque.register_consumer(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q      pgque.queue := pgque._queue(i_queue);
    v_tick bigint;
    v_id   integer;
    v_try  integer;
begin
    perform pgque._check_name('consumer', i_consumer);
    if exists (select 1 from pgque.subscription where sub_queue = q.queue_id and sub_name = i_consumer) then
        return 0;
    end if;
    -- Until this transaction ends, the key-share lock on the queue row keeps
    -- _tick_flip from dropping the starting tick (it cannot see this
    -- subscription before the commit).
    perform 1 from pgque.queue where queue_id = q.queue_id for key share;
    select tick_id into v_tick from pgque.tick where tick_queue = q.queue_id order by tick_id desc limit 1;
    if v_tick is null then
        -- A queue always has a tick; a snapshot taken before a tick flip
        -- (REPEATABLE READ, SERIALIZABLE) sees none of the kept ones: the
        -- flip copies them into the other partition and truncates this one.
        raise exception using errcode = 'PQ011',
            message = format('no tick of queue %L is visible to this transaction''s snapshot: subscribe in a READ COMMITTED transaction, not %s',
                             i_queue, current_setting('transaction_isolation'));
    end if;
    -- Ids come from a cycling sequence: nextval takes no lock (a reader's
    -- open transaction blocks nobody) and ids burnt by rolled-back
    -- subscribes come round again instead of running out. After the wrap
    -- an id may still be in use: the insert then does nothing and the next
    -- id is tried. Reusing an id is safe: batch ids never repeat, and every
    -- row keyed by a subscription id goes with its subscription.
    for v_try in 1 .. 1000 loop
        v_id := nextval('pgque.subscription_id_seq');
        insert into pgque.subscription (sub_id, sub_queue, sub_name, sub_last_tick)
        values (v_id, q.queue_id, i_consumer, v_tick)
        on conflict do nothing;
        if found then
            -- A reused id's old records are superseded by this newer one.
            perform pgque._put_state(row(v_id, null, null, v_tick, null, null, null, null, false, null, null)::pgque.sub_state);
            return 1;
        end if;
        if exists (select 1 from pgque.subscription where sub_queue = q.queue_id and sub_name = i_consumer) then
            return 0;
        end if;
    end loop;
    raise exception using errcode = 'PQ050',
        message = 'no free subscription id: 1000 ids in a row are in use (the limit is 1048575 subscriptions)';
end;
$$;

-- unregister_consumer(queue, consumer): removes the subscription, its open
-- batch and its pending retries. Raises PQ002 when it does not exist.
-- Returns 1.
create or replace function pgque.unregister_consumer(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._subscription(i_queue, i_consumer);
begin
    delete from pgque.subscription where sub_id = s.sub_id;
    return 1;
end;
$$;
