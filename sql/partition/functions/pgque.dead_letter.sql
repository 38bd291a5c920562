-- Dead letters: events that failed more than max_retries times, kept with
-- the consumer they failed for and the last failure's reason.

-- _dl_of(stored, consumer): whether a dead letter stored for consumer
-- name stored belongs to consumer: the same name, or one of its slots
-- (a slot consumer's dead letters are stored under the slot's
-- subscription, '<consumer>#<slot>/<N>', _slot_name). NULL consumer
-- matches every one. '#' is reserved in consumer names, so no other
-- consumer's name starts with '<consumer>#'. Inlined (plain SQL).
create or replace function pgque._dl_of(i_stored text, i_consumer text)
returns boolean language sql immutable
as $$
    select i_consumer is null or i_stored operator(pg_catalog.=) i_consumer
        or pg_catalog.starts_with(i_stored, i_consumer operator(pg_catalog.||) '#')
$$;

-- _dl_consumer_known(queue_id, queue, consumer): raises PQ002 unless
-- consumer is NULL, subscribed to the queue (as a plain consumer or by
-- its slots) or still has dead letters there (an unsubscribed consumer's
-- are kept): a misspelt name is an error, not an empty answer.
create or replace function pgque._dl_consumer_known(i_queue_id integer, i_queue text, i_consumer text)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_consumer is null
       or exists (select 1 from pgque.subscription s
                   where s.sub_queue = i_queue_id and pgque._dl_of(s.sub_name, i_consumer))
       or exists (select 1 from pgque.dead_letter d
                   where d.dl_queue = i_queue_id and pgque._dl_of(d.dl_consumer, i_consumer)) then
        return;
    end if;
    raise exception using errcode = 'PQ002',
        message = format('consumer %s is not subscribed to queue %s and has no dead letters there', i_consumer, i_queue);
end;
$$;

-- dlq_list(queue, consumer, max): the oldest dead letters of a queue (of
-- one consumer when given: a slot consumer's name selects every slot's),
-- at most max rows. Raises 42501 for a login that may not read a confined
-- queue (_authorize_read), PQ001 for an unknown queue, PQ011 for a NULL
-- or negative max, PQ002 for a consumer the queue does not know
-- (_dl_consumer_known). Returns per dead letter: dl_id, consumer (the
-- subscription it failed for: the slot's for a slot consumer,
-- '<consumer>#<slot>/<N>'), dl_time, reason, the event's ev_id, ev_time,
-- ev_retry, ev_type, ev_data (the payload), ev_extra1..4 (ev_extra1 is
-- the partition key), and, named: consumer_name (the consumer as
-- subscribed, without the slot), slot (NULL for a plain consumer) and
-- key (the partition key, NULL for the NULL key). Tables: dead_letter.
do $upgrade$
begin
    -- Before consumer_name, slot and key were added: the result type
    -- changes, which CREATE OR REPLACE cannot do (grants.sql grants it
    -- again).
    if exists (select 1 from pg_catalog.pg_proc
                where oid = to_regprocedure('pgque.dlq_list(text, text, integer)')
                  and not ('key' = any (proargnames))) then
        drop function pgque.dlq_list(text, text, integer);
    end if;
end
$upgrade$;
create or replace function pgque.dlq_list(i_queue text, i_consumer text default null, i_max integer default 100)
returns table (dl_id bigint, consumer text, dl_time timestamptz, reason text, ev_id bigint,
               ev_time timestamptz, ev_retry integer, ev_type text, ev_data text,
               ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text,
               consumer_name text, slot integer, key text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_ok boolean := pgque._authorize_read(i_queue);
    q pgque.queue := pgque._queue(i_queue);
begin
    if i_max is null or i_max < 0 then
        raise exception using errcode = 'PQ011', message = format('max must be zero or more, not %s', coalesce(i_max::text, 'NULL'));
    end if;
    return query
        select d.dl_id, d.dl_consumer, d.dl_time, d.dl_reason, d.ev_id, d.ev_time, d.ev_retry,
               d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4,
               regexp_replace(d.dl_consumer, '#[0-9]{1,4}/[0-9]{1,4}$', ''),
               substring(d.dl_consumer from '#([0-9]{1,4})/[0-9]{1,4}$')::integer,
               d.ev_extra1
          from pgque.dead_letter d
         where d.dl_queue = q.queue_id and pgque._dl_of(d.dl_consumer, i_consumer)
         order by d.dl_id
         limit i_max;
    if not found then
        perform pgque._dl_consumer_known(q.queue_id, i_queue, i_consumer);
    end if;
end;
$$;

-- dlq_replay_report(queue, dl_id): puts a dead letter back into the queue
-- for the consumer it failed for (same ev_id and extra fields, seen only
-- by that consumer), marked as a replay, and removes it from the
-- dead-letter table. The mark is ev_retry = -1 - n, n its retry count,
-- kept (receive returns it as retry_count: negative means a replay; see
-- _retries): no other event has a negative ev_retry, so ordinary events
-- carry nothing more. A replay comes after every event the consumer has
-- had, so it also says whether that breaks the key's order: later_delivered
-- counts the events of the dead letter's key with a greater ev_id that the
-- consumer has already been handed (finished batches, and the open one up
-- to what it was handed), but for those that are its dead letters still
-- (replayed after this one, they come in order); history_complete is
-- false when the event tables no longer hold the dead letter's own event,
-- so such later events may have been rotated away uncounted. A slot consumer's events are read
-- through its slot's routing index, a plain consumer's by a scan of the
-- queue's event tables. Returns also the subscription it was replayed for
-- (consumer, as dlq_list names it) and its key (NULL for the NULL key).
-- Raises PQ040 when there is no such dead letter, PQ002 when its consumer
-- is gone, 42501 for a login that may not read a confined queue. Tables:
-- dead_letter, event, subscription, sub_state, tick.
create or replace function pgque.dlq_replay_report(i_queue text, i_dl_id bigint)
returns table (ev_id bigint, later_delivered bigint, history_complete boolean, consumer text, key text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_ok boolean := pgque._authorize_read(i_queue);
    q pgque.queue := pgque._queue(i_queue);
    d pgque.dead_letter;
    s pgque.subscription;
    st pgque.sub_state;
    v_last pg_snapshot;
    v_next pg_snapshot;
    v_slot text[];
    v_later bigint;
    v_complete boolean;
begin
    delete from pgque.dead_letter x where x.dl_queue = q.queue_id and x.dl_id = i_dl_id returning * into d;
    if not found then
        raise exception using errcode = 'PQ040',
            message = format('dead letter %s does not exist in queue %L', coalesce(i_dl_id::text, 'NULL'), i_queue);
    end if;
    s := pgque._subscription(i_queue, d.dl_consumer);
    st := pgque._sub_state(s.sub_id);
    select tick_snapshot into v_last from pgque.tick where tick_queue = q.queue_id and tick_id = st.st_last_tick;
    select tick_snapshot into v_next from pgque.tick where tick_queue = q.queue_id and tick_id = st.st_next_tick;
    -- A slot's name says its slot and N (_slot_name), which the partition
    -- layer's routing filter turns into the routing index's expression.
    v_slot := regexp_match(d.dl_consumer, '#([0-9]{1,4})/([0-9]{1,4})$');
    -- Later events that are themselves this subscription's dead letters
    -- were never applied: replayed in order after this one, they keep
    -- the key's order.
    execute 'select count(distinct e.ev_id) filter (where e.ev_id > $3 and (pg_catalog.pg_visible_in_snapshot(e.ev_txid, $5)'
         || '            or (e.ev_id <= $7 and pg_catalog.pg_visible_in_snapshot(e.ev_txid, $6)))'
         || '            and not exists (select from pgque.dead_letter x where x.dl_queue = $9'
         || '                             and x.dl_consumer = $10 and x.ev_id = e.ev_id)),'
         || '       coalesce(bool_or(e.ev_id = $3 and e.ev_owner is null), false)'
         || '  from pgque.event e'
         || ' where e.ev_part >= $1 and e.ev_part < $2 and (e.ev_owner is null or e.ev_owner = $4)'
         || '   and e.ev_extra1 is not distinct from $8 and e.ev_id >= $3'
         || case when v_slot is not null
                 then coalesce(' and ' || pgque._slot_filter(v_slot[1]::integer, v_slot[2]::integer), '') else '' end
       into v_later, v_complete
      using pgque._part_lo(q.queue_id), pgque._part_hi(q.queue_id), d.ev_id, s.sub_id, v_last, v_next,
            coalesce(st.st_delivered_to, st.st_acked_to), d.ev_extra1, q.queue_id, d.dl_consumer;
    insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                             ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (d.ev_id, d.ev_time, pgque._part(q.queue_id, q.queue_cur_table), s.sub_id, -1 - d.ev_retry, d.ev_type, d.ev_data,
            d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4);
    perform nextval(q.queue_event_seq);
    return query select d.ev_id, v_later, v_complete, d.dl_consumer, d.ev_extra1;
end;
$$;

-- dlq_replay(queue, dl_id): dlq_replay_report without the report: returns
-- the ev_id. Same errors.
create or replace function pgque.dlq_replay(i_queue text, i_dl_id bigint)
returns bigint language sql security definer
set search_path = pg_catalog, pg_temp
as $$
    select r.ev_id from pgque.dlq_replay_report(i_queue, i_dl_id) r
$$;

-- dlq_purge(queue, consumer, older_than): deletes dead letters of a queue
-- (of one consumer when given, every slot of a slot consumer) older than
-- older_than. Returns how many. Like dlq_list, refuses (42501) a login
-- that may not read a confined queue, and a consumer the queue does not
-- know (PQ002). Tables: dead_letter.
create or replace function pgque.dlq_purge(i_queue text, i_consumer text default null,
                                           i_older_than interval default '0')
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_ok boolean := pgque._authorize_read(i_queue);
    q   pgque.queue := pgque._queue(i_queue);
    v_n bigint;
    v_cut timestamptz;
begin
    if i_older_than is null or i_older_than < interval '0' then
        raise exception using errcode = 'PQ011',
            message = format('older_than must be zero or more, not %s', coalesce(i_older_than::text, 'NULL'));
    end if;
    -- An age before the first timestamp is no age a dead letter can have:
    -- refused as the argument it is, not as a timestamp overflow.
    begin
        v_cut := clock_timestamp() - i_older_than;
    exception when datetime_field_overflow or interval_field_overflow or numeric_value_out_of_range then
        raise exception using errcode = 'PQ011',
            message = format('older_than %s is out of range', i_older_than);
    end;
    delete from pgque.dead_letter
     where dl_queue = q.queue_id and pgque._dl_of(dl_consumer, i_consumer)
       and dl_time <= v_cut;
    get diagnostics v_n = row_count;
    if v_n = 0 then
        perform pgque._dl_consumer_known(q.queue_id, i_queue, i_consumer);
    end if;
    return v_n;
end;
$$;
