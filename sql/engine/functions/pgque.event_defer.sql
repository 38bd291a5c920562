-- Deferral: set events aside without counting a retry.
--
-- event_retry is for an event that failed: it counts toward max_retries.
-- Deferral is for an event that must wait for another one: it is copied to
-- pgque.deferred under a caller-chosen group, untouched (ev_retry as it was),
-- and event_undefer later moves the whole group back into the queue's
-- current event table, owned by the subscription, where it is delivered in
-- ev_id order in the next batch. Deferring the same event twice is a no-op.

-- _defer_row(sub_id, group, event fields): defers one event whose fields
-- the caller already has. Returns 1 when deferred, 0 when it already was.
create or replace function pgque._defer_row(
    i_sub integer, i_group text, i_ev_id bigint, i_ev_time timestamptz, i_ev_retry integer,
    i_type text, i_data text, i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into pgque.deferred (ev_owner, ev_id, ev_group, ev_queue, ev_time, ev_retry,
                                ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    select i_sub, i_ev_id, i_group, s.sub_queue, i_ev_time, i_ev_retry,
           i_type, i_data, i_extra1, i_extra2, i_extra3, i_extra4
      from pgque.subscription s where s.sub_id = i_sub
    on conflict (ev_owner, ev_id) do nothing;
    return case when found then 1 else 0 end;
end;
$$;

-- event_defer(batch_id, ev_id, group): defers one event of an open batch
-- under group. Returns 1 when deferred, 0 when it already was; PQ022 when
-- the event is not in the batch.
create or replace function pgque.event_defer(i_batch_id bigint, i_ev_id bigint, i_group text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._batch(i_batch_id);
    e record;
begin
    if i_ev_id is null or i_group is null then
        raise exception using errcode = '22004', message = 'event id and group must not be NULL';
    end if;
    select * into e from pgque._batch_event(s, i_ev_id);
    return pgque._defer_row(s.sub_id, i_group, e.ev_id, e.ev_time, e.ev_retry, e.ev_type, e.ev_data,
                            e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4);
end;
$$;

-- _undefer(sub_id, group): moves a deferred group back into the log, owned
-- by the subscription. Returns how many events and the highest ev_id.
create or replace function pgque._undefer(i_sub integer, i_group text,
                                          out o_count integer, out o_max_id bigint)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    with moved as (
        delete from pgque.deferred d
         where d.ev_owner = i_sub and d.ev_group = i_group
        returning d.*
    ), ins as (
        insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                                 ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        select m.ev_id, m.ev_time, pgque._part(q.queue_id, q.queue_cur_table), m.ev_owner, m.ev_retry,
               m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4
          from moved m join pgque.queue q on q.queue_id = m.ev_queue
        returning ev_id, ev_part
    )
    select count(*), max(ins.ev_id) into o_count, o_max_id from ins;
    if o_count > 0 then
        -- Let the ticker see pending work, as maint_retry_events does.
        perform nextval(q.queue_event_seq)
           from pgque.queue q join pgque.subscription s on s.sub_queue = q.queue_id
          where s.sub_id = i_sub;
    end if;
end;
$$;

-- event_undefer(queue, consumer, group): re-delivers a deferred group to the
-- consumer, in ev_id order, in a coming batch. Returns how many events.
create or replace function pgque.event_undefer(i_queue text, i_consumer text, i_group text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._subscription(i_queue, i_consumer);
begin
    if i_group is null then
        raise exception using errcode = '22004', message = 'group must not be NULL';
    end if;
    return (pgque._undefer(s.sub_id, i_group)).o_count;
end;
$$;
