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
    l pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
begin
    return query
        select d.*, l.sl_epoch
          from pgque._deliver(i_queue, pgque._slot_name(i_consumer, i_slot, i_nslots), i_max,
                              pgque._slot_filter(i_slot, i_nslots)) d;
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
    l pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
begin
    return pgque._ack(pgque._slot_batch(l), pgque._slot_filter(i_slot, i_nslots));
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
    l pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
begin
    return pgque._event_retry(pgque._slot_batch(l), i_msg_id, i_retry_after, i_reason);
end;
$$;
