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
    perform pgque._make_reader(v_queue, 1, false); -- see pgque.deliver_raw.sql, "Readers"
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

-- _own_subscriptions(queue_id, consumer): the subscriptions of consumer
-- (its plain one, or every slot "<consumer>#<slot>/<nslots>"), with
-- whether the current transaction created them (their row's xmin is its
-- xid; a subtransaction's insert would not match, and is not counted).
-- Tables: reads subscription.
create or replace function pgque._own_subscriptions(i_queue_id integer, i_consumer text)
returns table (sub_id integer, created_now boolean) language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select s.sub_id,
           s.xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text
      from pgque.subscription s
     where s.sub_queue = i_queue_id
       and (s.sub_name = i_consumer or left(s.sub_name, length(i_consumer) + 1) = i_consumer || '#')
$$;

-- rewind_new_subscription(queue, consumer): moves the subscriptions of
-- consumer (plain, or all its slots) that this transaction created back to
-- the oldest position from which the queue still keeps every event: the
-- oldest cursor of the queue's other subscriptions. Rotation never
-- truncates an event some cursor has not passed, and no tick from the
-- oldest cursor on is dropped, so everything committed after that tick is
-- still there and the new subscription receives it, in order, as if it
-- had been subscribed then. Without another subscription the queue keeps
-- nothing for anyone (tables rotate freely, old ticks are dropped): no
-- rewind is possible, and the subscription stays where it starts. Only a
-- subscription created in this transaction may be rewound: one that
-- already received events would receive them again, and until this
-- transaction commits the key-share lock register_consumer took on the
-- queue row keeps rotation and the tick flip from dropping what the
-- rewound cursor needs. Returns how many event ids were taken between the
-- new start and the old one (0: not moved; an upper bound of the events
-- gained, as ids of rolled-back sends and force_next_tick's advances
-- count). Raises PQ002 when consumer
-- has no subscription, PQ011 when this transaction created none of them.
-- Tables: subscription, sub_state (append), tick (read).
create or replace function pgque.rewind_new_subscription(i_queue text, i_consumer text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_queue integer;
    v_new   integer[];
    v_from  bigint;
    v_to    bigint;
    v_gain  bigint;
    v_sub   integer;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    v_queue := (pgque._queue(i_queue)).queue_id;
    perform pgque._check_consumer(i_consumer);
    select array_agg(o.sub_id) filter (where o.created_now), count(*)
      into v_new, v_gain
      from pgque._own_subscriptions(v_queue, i_consumer) o;
    if v_gain = 0 then
        raise exception using errcode = 'PQ002',
            message = format('consumer %L is not subscribed to queue %L', i_consumer, i_queue);
    end if;
    if v_new is null then
        raise exception using errcode = 'PQ011',
            message = format('consumer %L of queue %L was not subscribed in this transaction: only a new subscription can be rewound (one that received events would receive them again)',
                             i_consumer, i_queue);
    end if;
    perform 1 from pgque.queue where queue_id = v_queue for key share;
    select min(st.st_last_tick) into v_from
      from pgque.subscription s cross join lateral pgque._sub_state(s.sub_id) st
     where s.sub_queue = v_queue and s.sub_id <> all (v_new);
    select min(st.st_last_tick) into v_to
      from unnest(v_new) n(id) cross join lateral pgque._sub_state(n.id) st;
    if v_from is null or v_from >= v_to then
        return 0;
    end if;
    foreach v_sub in array v_new loop
        update pgque.subscription set sub_last_tick = v_from where sub_id = v_sub;
        perform pgque._put_state(row(v_sub, null, null, v_from, null, null, null, null, false, null, null)::pgque.sub_state);
    end loop;
    select t.tick_event_seq - f.tick_event_seq into v_gain
      from pgque.tick t, pgque.tick f
     where t.tick_queue = v_queue and t.tick_id = v_to and f.tick_queue = v_queue and f.tick_id = v_from;
    return coalesce(v_gain, 0);
end;
$$;

-- events_before_subscription(queue, consumer): how many events the queue
-- still holds that were committed before the oldest cursor of consumer's
-- subscriptions (plain, or any of its slots): right after subscribing, the
-- events sent before the subscription that it will never receive. Counting
-- stops at 10000, so the cost is bounded whatever the backlog; events the
-- queue no longer holds (rotated away) are not counted. Raises PQ002 when
-- consumer is not subscribed. Tables: reads subscription, sub_state, tick,
-- event.
create or replace function pgque.events_before_subscription(i_queue text, i_consumer text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_queue integer;
    v_tick  bigint;
    v_snap  pg_snapshot;
    v_n     bigint;
begin
    perform pgque._authorize_read(i_queue); -- a confined queue's count is its readers'
    v_queue := (pgque._queue(i_queue)).queue_id;
    perform pgque._check_consumer(i_consumer);
    select min(st.st_last_tick) into v_tick
      from pgque._own_subscriptions(v_queue, i_consumer) o cross join lateral pgque._sub_state(o.sub_id) st;
    if v_tick is null then
        raise exception using errcode = 'PQ002',
            message = format('consumer %L is not subscribed to queue %L', i_consumer, i_queue);
    end if;
    select tick_snapshot into v_snap from pgque.tick where tick_queue = v_queue and tick_id = v_tick;
    select count(*) into v_n
      from (select 1 from pgque.event e
             where e.ev_part >= pgque._part_lo(v_queue) and e.ev_part < pgque._part_hi(v_queue) and e.ev_owner is null
               and pg_visible_in_snapshot(e.ev_txid, v_snap)
             limit 10000) x;
    return v_n;
end;
$$;
