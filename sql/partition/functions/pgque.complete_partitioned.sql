-- Transactional completion for slots: complete_partitioned_in_tx is
-- complete_in_tx (api/functions/pgque.complete.sql) for a slot, fenced by
-- the lease. See docs/design.md, "Transactional handlers".

-- complete_partitioned_in_tx(queue, consumer, slot, nslots, worker, token,
-- epoch, batch_id, msg_id): marks event msg_id, received by this holder of
-- the slot's lease in its current chunk, done for the slot, in the
-- caller's transaction. It proves the lease as ack_partitioned does
-- (PQ085: the token does not prove the lease; PQ032: the chunk was
-- received under an older epoch; PQ035: the chunk was acknowledged
-- already, unless the event's key is held by this epoch: a key lane's
-- event that runs on after the chunk's ack) and then keeps a key share
-- lock on the lease row until the transaction ends: a takeover, which
-- locks that row FOR UPDATE, waits for it, so a worker that lost its lease
-- cannot commit and one that commits still held it; the owner's own calls
-- do not wait for it ("Lease row locks" in pgque.slot_lease.sql). PQ038
-- when the event was completed already. Call it last, just before COMMIT
-- (a takeover waits for the lock); roll back on any error. READ COMMITTED
-- only (PQ011). Tables: slot_lease (key share lock), sub_state, deferred,
-- key_block (read), event_done (insert).
create or replace function pgque.complete_partitioned_in_tx(i_queue text, i_consumer text, i_slot integer,
                                                            i_nslots integer, i_worker text, i_token uuid,
                                                            i_epoch bigint, i_batch_id bigint, i_msg_id bigint)
returns void language plpgsql security definer
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
declare
    l pgque.slot_lease;
begin
    if i_epoch is null or i_batch_id is null or i_msg_id is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and msg_id must not be NULL';
    end if;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_read_committed();
    perform pgque._check_worker(i_worker);
    perform pgque._check_token(i_token);
    perform pgque._check_slot(i_slot, i_nslots);
    perform pgque._slot_group(i_queue, i_consumer, i_nslots);
    select l1.* into l from pgque.slot_lease l1 join pgque.queue q on q.queue_id = l1.sl_queue
     where q.queue_name = i_queue and l1.sl_consumer = i_consumer and l1.sl_slot = i_slot
       for key share of l1;
    if not found then
        l := pgque._lease(i_queue, i_consumer, i_slot); -- raises the error that says why
    end if;
    perform pgque._refuse_unproved(l, i_worker, i_token);
    -- An event is proved by the chunk it came in; a held key's event (its
    -- lane runs on after the chunk's ack) by the hold its epoch took. The
    -- chunk is looked at first: the hold is taken in the transaction that
    -- acknowledges the chunk, so a look at the hold that comes after the
    -- chunk was found acknowledged sees it. The other order read them
    -- under two snapshots, and a settle that committed between the two
    -- refused a held key's event with PQ035.
    if i_epoch is distinct from l.sl_epoch
       or not pgque._in_chunk(pgque._sub_state(l.sl_sub), i_batch_id, i_msg_id) then
        if i_epoch is distinct from l.sl_epoch
           or not exists (select 1 from pgque.deferred d
                            join pgque.key_block b on b.kb_sub = d.ev_owner and b.kb_kid = d.ev_group
                           where d.ev_owner = l.sl_sub and d.ev_id = i_msg_id
                             and b.kb_state = 'inflight' and b.kb_epoch = i_epoch) then
            perform pgque._check_delivery(l, i_epoch, i_batch_id, i_msg_id); -- raises what is wrong
        end if;
    end if;
    perform pgque._done_record(l.sl_sub, i_batch_id, i_msg_id);
end;
$$;
