-- Retries.
--
-- event_retry copies one event of an open batch to retry_queue, owned by the
-- batch's subscription, with ev_retry + 1; maint_retry_events puts due
-- copies back into the queue's current event table (same ev_id and extra
-- fields, a new ev_txid), where only that subscription sees them. An event
-- that already had max_retries retries goes to dead_letter instead.
-- A second retry of the same event while a copy is pending is a no-op.
--
-- ev_retry is negative on a replayed dead letter (dlq_replay): -1 - n,
-- n its retries so far, kept across the replay. _retries reads n either
-- way; _retried counts one more and keeps the mark, so a replay's retries
-- still say they are a replay. Ordinary events never pay for it: only a
-- nack reads them.

-- _retries(ev_retry): the retry count stored as ev_retry (NULL: 0).
create or replace function pgque._retries(i_retry integer)
returns integer language sql immutable
as $$
    select case when i_retry operator(pg_catalog.<) 0 then -1 operator(pg_catalog.-) i_retry
                else coalesce(i_retry, 0) end
$$;

-- _retried(ev_retry): ev_retry after one more retry, a replay still marked.
create or replace function pgque._retried(i_retry integer)
returns integer language sql immutable
as $$
    select case when i_retry operator(pg_catalog.<) 0 then i_retry operator(pg_catalog.-) 1
                else coalesce(i_retry, 0) operator(pg_catalog.+) 1 end
$$;

-- _event_retry(batch_id, ev_id, retry_after, reason): returns 1 when the
-- event was scheduled for retry, 0 when it was dead-lettered. retry_after
-- must be 0 to 30 days (PQ011); a NULL retry_after dead-letters the event at
-- once, whatever its retry count: a consumer's way to say that retrying
-- cannot help (nack and nack_partitioned pass it through). The reason is
-- cut to 1000 characters.
create or replace function pgque._event_retry(
    i_batch_id bigint, i_ev_id bigint, i_retry_after interval, i_reason text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    s   pgque.subscription := pgque._batch(i_batch_id);
    e   record;
    q   pgque.queue;
    v_after  interval;
    v_reason text;
begin
    if i_ev_id is null then
        raise exception using errcode = '22004', message = 'event id must not be NULL';
    end if;
    -- Bounded on the real duration (months are not 30 days), and the
    -- reason on its length, so a nack can neither park an event for
    -- centuries nor store an unbounded text.
    if i_retry_after is not null then
        v_after := pgque._check_interval('retry delay', i_retry_after, interval '0', interval '30 days');
    end if;
    v_reason := left(i_reason, 1000);
    select * into e from pgque._batch_event(s, i_ev_id);
    select * into q from pgque.queue where queue_id = s.sub_queue;

    if i_retry_after is null or pgque._retries(e.ev_retry) >= q.queue_max_retries then
        insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_txid, ev_retry,
                                       ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        values (s.sub_queue, s.sub_name, v_reason, e.ev_id, e.ev_time, e.ev_txid::text::xid8, pgque._retries(e.ev_retry),
                e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4);
        return 0;
    end if;
    insert into pgque.retry_queue (ev_owner, ev_id, ev_queue, ev_retry_after, ev_time, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (s.sub_id, e.ev_id, s.sub_queue, clock_timestamp() + v_after, e.ev_time,
            pgque._retried(e.ev_retry), e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4)
    on conflict (ev_owner, ev_id) do nothing;
    return 1;
end;
$$;

-- event_retry(batch_id, ev_id, retry_seconds): PgQ's retry call.
-- Returns 1 when scheduled for retry, 0 when dead-lettered.
create or replace function pgque.event_retry(i_batch_id bigint, i_ev_id bigint, i_retry_seconds integer)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_retry_seconds is null then
        raise exception using errcode = '22004', message = 'retry seconds must not be NULL';
    end if;
    return pgque._event_retry(i_batch_id, i_ev_id, make_interval(secs => i_retry_seconds), null);
end;
$$;

-- maint_retry_events(): moves every due retry back into its queue's current
-- event table, in one statement, then advances each affected queue's event
-- sequence by one so the ticker sees pending work and ticks within
-- ticker_max_lag. Returns the number of events moved. A due retry whose
-- row another transaction holds (an unsubscribe left open, whose cascade
-- deletes it) is skipped and moved by a later call once that transaction
-- rolled back: waiting for it stopped every queue's retries, and the
-- ticker daemons' loop with them, for as long as a consumer role kept the
-- transaction open.
create or replace function pgque.maint_retry_events()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_n      integer;
    v_queues integer[];
begin
    with due as (
        delete from pgque.retry_queue r
         where (r.ev_owner, r.ev_id) in (select r2.ev_owner, r2.ev_id from pgque.retry_queue r2
                                          where r2.ev_retry_after <= clock_timestamp()
                                            for update skip locked)
        returning r.*
    ), moved as (
        insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                                 ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        select d.ev_id, d.ev_time, pgque._part(q.queue_id, q.queue_cur_table), d.ev_owner, d.ev_retry,
               d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
          from due d join pgque.queue q on q.queue_id = d.ev_queue
        returning ev_part
    )
    select count(*), array_agg(distinct pgque._part_queue(m.ev_part)) into v_n, v_queues from moved m;
    perform nextval(q.queue_event_seq) from pgque.queue q where q.queue_id = any(v_queues);
    return v_n;
end;
$$;
