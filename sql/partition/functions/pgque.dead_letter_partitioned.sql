-- Dead-lettering one event of a slot's open batch at once, without waiting
-- for max_retries: for a handler that knows the event can never succeed
-- (a poison event).

-- dead_letter_partitioned(queue, consumer, slot, nslots, worker, msg_id,
-- reason): moves one received event of the slot's open batch to
-- dead_letter (with its retry count and the reason), as nack_partitioned
-- does past max_retries. Under the pause policy the key's later events of
-- the chunk are deferred and the key resolves at once, so they are then
-- delivered in ev_id order. Raises PQ032 when the caller does not hold the
-- lease, PQ020 when the slot has no open batch, PQ022 when the event is not
-- in it, 22004 when msg_id is NULL.
-- Returns the ev_id. Tables: dead_letter (insert); key_block and deferred
-- events under pause.
create or replace function pgque.dead_letter_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                         i_nslots integer, i_worker text, i_msg_id bigint,
                                                         i_reason text default null)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l        pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker);
    v_batch  bigint := pgque._slot_batch(l);
    v_filter text := pgque._slot_filter(i_slot, i_nslots);
    s        pgque.subscription := pgque._batch(v_batch);
    e        record;
    v_pause  boolean;
    c        refcursor := 'pgque_dead_' || v_batch;
begin
    if i_msg_id is null then
        raise exception using errcode = '22004', message = 'msg_id must not be NULL';
    end if;
    -- The event must belong to this slot's share of the batch: another
    -- slot's event is not this worker's to dead-letter.
    select g.ev_id, g.ev_time, g.ev_txid, g.ev_retry, g.ev_type, g.ev_data,
           g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4 into e
      from pgque.get_batch_cursor(v_batch, c::text, 1, concat_ws(' and ', v_filter, 'ev_id = ' || i_msg_id)) g;
    if not found then
        raise exception using errcode = 'PQ022', message = format('event %s is not in batch %s', i_msg_id, v_batch);
    end if;
    close c;
    insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_txid, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (s.sub_queue, s.sub_name, i_reason, e.ev_id, e.ev_time, e.ev_txid::text::xid8, coalesce(e.ev_retry, 0),
            e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4);
    select sg_policy = 'pause' into v_pause from pgque.slot_group
     where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer;
    if v_pause then
        perform pgque._pause_on_nack(l, i_nslots, v_batch, i_msg_id, e.ev_extra1, false, i_reason);
    end if;
    return e.ev_id;
end;
$$;
