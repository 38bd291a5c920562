-- Monitoring. A confined queue is shown only to logins that may read it
-- (_authorize_read, _may_read in pgque.authorize.sql): naming it raises
-- 42501, listing every queue leaves it out.

-- get_queue_info([queue]): one row per queue with its settings, its last
-- tick, ticker_lag (time since the last tick), ev_new (events inserted since
-- the last tick) and ev_per_sec (over the ticks still kept).
create or replace function pgque.get_queue_info(i_queue text default null)
returns table (queue_name text, queue_ntables integer, queue_cur_table integer,
               queue_rotation_period interval, queue_switch_time timestamptz,
               queue_ticker_max_count integer, queue_ticker_max_lag interval,
               queue_ticker_idle_period interval, queue_max_retries integer,
               ticker_lag interval, ev_per_sec double precision, ev_new bigint,
               last_tick_id bigint, retry_pending bigint, dead_letters bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    if i_queue is not null then
        perform pgque._authorize_read(i_queue);
        perform pgque._queue(i_queue);
    end if;
    return query
    select q.queue_name, q.queue_ntables, q.queue_cur_table, q.queue_rotation_period, q.queue_switch_time,
           q.queue_ticker_max_count, q.queue_ticker_max_lag, q.queue_ticker_idle_period, q.queue_max_retries,
           clock_timestamp() - lt.tick_time,
           case when ft.tick_id is not null and lt.tick_time > ft.tick_time
                then (lt.tick_event_seq - ft.tick_event_seq)
                     / extract(epoch from lt.tick_time - ft.tick_time)::double precision end,
           greatest(coalesce(pg_sequence_last_value(q.queue_event_seq), 0) - lt.tick_event_seq, 0),
           lt.tick_id,
           (select count(*) from pgque.retry_queue r where r.ev_queue = q.queue_id),
           (select count(*) from pgque.dead_letter d where d.dl_queue = q.queue_id)
      from pgque.queue q
      cross join lateral (select * from pgque.tick t where t.tick_queue = q.queue_id
                           order by t.tick_id desc limit 1) lt
      left join lateral (select * from pgque.tick t where t.tick_queue = q.queue_id
                           order by t.tick_id asc limit 1) ft on true
     where (i_queue is null or q.queue_name = i_queue) and pgque._may_read(q.queue_id)
     order by q.queue_name;
end;
$$;

-- get_consumer_info([queue[, consumer]]): one row per subscription: lag
-- (age of its cursor's tick), last_seen (since it last opened or finished a
-- batch), pending_events (events inserted after its cursor, all keys),
-- its open batch, and its pending retries.
create or replace function pgque.get_consumer_info(i_queue text default null, i_consumer text default null)
returns table (queue_name text, consumer_name text, lag interval, last_seen interval,
               last_tick bigint, current_batch bigint, next_tick bigint,
               pending_events bigint, retry_pending bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    if i_queue is not null then
        perform pgque._authorize_read(i_queue);
        perform pgque._queue(i_queue);
    end if;
    return query
    select q.queue_name, s.sub_name, clock_timestamp() - ct.tick_time, clock_timestamp() - st.st_time,
           st.st_last_tick, st.st_batch, st.st_next_tick,
           greatest(coalesce(pg_sequence_last_value(q.queue_event_seq), 0) - ct.tick_event_seq, 0),
           (select count(*) from pgque.retry_queue r where r.ev_owner = s.sub_id)
      from pgque.subscription s
      join pgque.queue q on q.queue_id = s.sub_queue
      cross join lateral pgque._sub_state(s.sub_id) st
      cross join lateral (select * from pgque.tick t where t.tick_queue = s.sub_queue
                           and t.tick_id = st.st_last_tick limit 1) ct
     where (i_queue is null or q.queue_name = i_queue)
       and (i_consumer is null or s.sub_name = i_consumer)
       and pgque._may_read(q.queue_id)
     order by q.queue_name, s.sub_name;
end;
$$;
