-- Consuming a slot. Each call first proves the caller holds the slot's
-- lease (and renews it), then delivers through the api layer with the
-- slot's routing predicate. The epoch is returned with every row as a
-- fencing token for the handler's side effects.

-- receive_partitioned(queue, consumer, slot, nslots, worker, max): the next
-- chunk of the slot's open batch: events of this slot only, in ev_id order.
create or replace function pgque.receive_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                     i_nslots integer, i_worker text, i_max integer default 100)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text,
               epoch bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l        pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
    v_sub    text := pgque._slot_name(i_consumer, i_slot, i_nslots);
    v_filter text := pgque._slot_filter(i_slot, i_nslots);
    r        record;
    v_batch  bigint;
    v_out    integer;
    v_round  integer := 0;
    v_kids   text[];
begin
    -- Fast path: no blocked key on this slot (always so under skip).
    if not exists (select 1 from pgque.key_block where kb_sub = l.sl_sub) then
        return query select d.*, l.sl_epoch from pgque._deliver(i_queue, v_sub, i_max, v_filter) d;
        return;
    end if;
    -- Pause with blocked keys: defer what must wait; a chunk that was all
    -- deferred is acknowledged here and the next one is fetched. The slot's
    -- blocked keys are read once per call, so rows of healthy keys cost one
    -- array test, not a lookup.
    v_kids := array(select kb_kid from pgque.key_block where kb_sub = l.sl_sub);
    loop
        v_batch := null;
        v_out := 0;
        for r in select * from pgque._deliver(i_queue, v_sub, i_max, v_filter) loop
            v_batch := r.batch_id;
            if not ((case when r.partition_key is null then 'n' else 'k' || r.partition_key end) = any(v_kids))
               or pgque._pause_keep(l.sl_sub, r.batch_id, r.msg_id, r.partition_key) then
                msg_id := r.msg_id;
                batch_id := r.batch_id;
                type := r.type;
                payload := r.payload;
                retry_count := r.retry_count;
                created_at := r.created_at;
                partition_key := r.partition_key;
                extra2 := r.extra2;
                extra3 := r.extra3;
                extra4 := r.extra4;
                epoch := l.sl_epoch;
                return next;
                v_out := v_out + 1;
            else
                perform pgque._defer_row(l.sl_sub, pgque._kid(r.partition_key), r.msg_id, r.created_at,
                                         r.retry_count, r.type, r.payload::text, r.partition_key,
                                         r.extra2, r.extra3, r.extra4);
            end if;
        end loop;
        if v_batch is null or v_out > 0 then
            return;
        end if;
        perform pgque._ack(v_batch, v_filter);
        v_round := v_round + 1;
        exit when v_round >= 100;
    end loop;
end;
$$;

-- _slot_batch(lease): the slot's open batch, or PQ020.
create or replace function pgque._slot_batch(l pgque.slot_lease)
returns bigint language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch bigint;
begin
    select sub_batch into v_batch from pgque.subscription where sub_id = l.sl_sub;
    if v_batch is null then
        raise exception using errcode = 'PQ020',
            message = format('slot %s of consumer %L has no open batch', l.sl_slot, l.sl_consumer);
    end if;
    return v_batch;
end;
$$;

-- ack_partitioned(queue, consumer, slot, nslots, worker): acknowledges the
-- chunk the last receive_partitioned returned. Returns 1 when the batch is
-- finished, 0 when more of it remains.
create or replace function pgque.ack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                 i_nslots integer, i_worker text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l       pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
    v_batch bigint := pgque._slot_batch(l);
    v_done  integer;
begin
    v_done := pgque._ack(v_batch, pgque._slot_filter(i_slot, i_nslots));
    if exists (select 1 from pgque.key_block where kb_sub = l.sl_sub) then
        perform pgque._pause_on_ack(l.sl_sub, v_batch);
    end if;
    return v_done;
end;
$$;

-- nack_partitioned(queue, consumer, slot, nslots, worker, msg_id,
-- retry_after, reason): schedules one received event for redelivery to this
-- slot only, or dead-letters it past max_retries. Returns 1 or 0 as nack.
create or replace function pgque.nack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                  i_nslots integer, i_worker text, i_msg_id bigint,
                                                  i_retry_after interval, i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l        pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
    v_batch  bigint := pgque._slot_batch(l);
    v_filter text := pgque._slot_filter(i_slot, i_nslots);
    v_pause  boolean;
    v_key    text;
    v_retried integer;
    c        refcursor := 'pgque_nack_' || v_batch;
begin
    select sg_policy = 'pause' into v_pause from pgque.slot_group
     where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer;
    if v_pause then
        if i_msg_id is null then
            raise exception using errcode = '22004', message = 'msg_id must not be NULL';
        end if;
        select g.ev_extra1 into v_key
          from pgque.get_batch_cursor(v_batch, c::text, 1, concat_ws(' and ', v_filter, 'ev_id = ' || i_msg_id)) g;
        if not found then
            raise exception using errcode = 'PQ022', message = format('event %s is not in batch %s', i_msg_id, v_batch);
        end if;
        close c;
    end if;
    v_retried := pgque._event_retry(v_batch, i_msg_id, i_retry_after, i_reason);
    if v_pause then
        perform pgque._pause_on_nack(l, i_nslots, v_batch, i_msg_id, v_key, v_retried = 1, i_reason);
    end if;
    return v_retried;
end;
$$;
