-- subscribe(queue, consumer): registers a plain consumer. "#" and "/" are
-- reserved for slot subscriptions and rejected here. Returns 1 when new,
-- 0 when it existed.
create or replace function pgque.subscribe(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._queue(i_queue);
    perform pgque._check_name('consumer', i_consumer);
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
    perform pgque._queue(i_queue);
    perform pgque._check_name('consumer', i_consumer);
    if not exists (select 1 from pgque.subscription s join pgque.queue q on q.queue_id = s.sub_queue
                    where q.queue_name = i_queue and s.sub_name = i_consumer) then
        return 0;
    end if;
    return pgque.unregister_consumer(i_queue, i_consumer);
end;
$$;
