-- _check_consumer(name): validates a consumer name given by a user. "#"
-- and "/" are reserved: the partition layer names slot subscriptions
-- "<consumer>#<slot>/<nslots>".
create or replace function pgque._check_consumer(i_name text)
returns text language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if strpos(i_name, '#') > 0 or strpos(i_name, '/') > 0 then
        raise exception using errcode = 'PQ010',
            message = format('consumer name %L uses a reserved character: "#" and "/" name slot subscriptions', i_name);
    end if;
    return pgque._check_name('consumer', i_name);
end;
$$;

-- subscribe(queue, consumer): registers a plain consumer. "#" and "/" are
-- reserved for slot subscriptions and rejected here. Returns 1 when new,
-- 0 when it existed.
create or replace function pgque.subscribe(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_queue integer;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    v_queue := (pgque._queue(i_queue)).queue_id;
    perform pgque._check_consumer(i_consumer);
    perform pgque._make_reader(v_queue, 1, false); -- see deliver_raw.sql, "Readers"
    return pgque.register_consumer(i_queue, i_consumer);
end;
$$;

-- unsubscribe(queue, consumer): removes a plain consumer with its open
-- batch and pending retries. Returns 1 when removed, 0 when it was not
-- subscribed.
create or replace function pgque.unsubscribe(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._queue(i_queue);
    perform pgque._check_consumer(i_consumer);
    if not exists (select 1 from pgque.subscription s join pgque.queue q on q.queue_id = s.sub_queue
                    where q.queue_name = i_queue and s.sub_name = i_consumer) then
        return 0;
    end if;
    return pgque.unregister_consumer(i_queue, i_consumer);
end;
$$;
