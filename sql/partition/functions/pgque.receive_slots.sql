-- receive_partitioned_raw_slots(queue, consumer, worker, max, slots,
-- nslots, tokens[, ack_epochs, ack_batch_ids, ack_msg_ids]):
-- receive_partitioned_raw for several slots of one worker in one call and
-- one transaction. Element k of the arrays is slot k's call: its slot, its
-- N, its lease token and (NULL when there is none) the proof of the chunk
-- it handed out last, which is acknowledged first. Each row comes with the
-- slot and N it was received for.
--
-- Why: a tick touches a few slots at once, and the pool of the process
-- that owns them wakes them together. One call per slot costs one round
-- trip, one transaction and one commit each; here they are paid once (see
-- "One call for the slots a tick wakes" in docs/design.md).
--
-- All or nothing: when any slot's call fails (a lease lost, a proof that
-- does not match) the whole call fails, nothing is acknowledged or
-- received, and the caller asks slot by slot to learn which one. The
-- slots are served in (N, slot) order, so two calls never take the same
-- leases and subscriptions in opposite orders.
--
-- SECURITY INVOKER: each slot goes through receive_partitioned_raw, its
-- access check and lease proof, with the caller's rights; this function
-- adds no right of its own.
create or replace function pgque.receive_partitioned_raw_slots(i_queue text, i_consumer text, i_worker text,
                                                               i_max integer, i_slots integer[], i_nslots integer[],
                                                               i_tokens uuid[], i_ack_epochs bigint[] default null,
                                                               i_ack_batch_ids bigint[] default null,
                                                               i_ack_msg_ids bigint[] default null)
returns table (slot integer, nslots integer, msg_id bigint, batch_id bigint, type text, payload text,
               retry_count integer, created_at timestamptz, partition_key text, extra2 text, extra3 text,
               extra4 text, epoch bigint)
language plpgsql
set search_path = pg_catalog, pg_temp
as $body$
declare
    v_n integer := cardinality(i_slots);
    k   integer;
begin
    if i_slots is null or i_nslots is null or i_tokens is null then
        raise exception using errcode = '22004', message = 'slots, nslots and tokens must not be NULL';
    end if;
    if array_ndims(i_slots) > 1 or cardinality(i_nslots) <> v_n or cardinality(i_tokens) <> v_n
       or cardinality(i_ack_epochs) <> v_n or cardinality(i_ack_batch_ids) <> v_n
       or cardinality(i_ack_msg_ids) <> v_n then
        raise exception using errcode = '22023',
            message = format('slots, nslots, tokens and the ack arrays must be one-dimensional and of one length (%s slots)', v_n);
    end if;
    if v_n > 1024 then
        raise exception using errcode = '22023', message = format('at most 1024 slots in one call, not %s', v_n);
    end if;
    if (select count(distinct (s, n)) from unnest(i_slots, i_nslots) u(s, n)) <> v_n then
        raise exception using errcode = '22023', message = 'a slot is named twice';
    end if;
    for k in select u.o from unnest(i_slots, i_nslots) with ordinality u(s, n, o) order by u.n, u.s loop
        return query
        select i_slots[k], i_nslots[k], r.msg_id, r.batch_id, r.type, r.payload, r.retry_count, r.created_at,
               r.partition_key, r.extra2, r.extra3, r.extra4, r.epoch
          from pgque.receive_partitioned_raw(i_queue, i_consumer, i_slots[k], i_nslots[k], i_worker, i_tokens[k], i_max,
                                             i_ack_epochs[k], i_ack_batch_ids[k], i_ack_msg_ids[k]) r;
    end loop;
end;
$body$;
