-- Key holds: how a slot worked by key lanes lets its cursor move past a
-- slow key (see structure/key_hold.sql for the state).
--
-- hold_key_partitioned, called in the chunk's settling transaction before
-- ack_partitioned, defers copies of a running key's events of the chunk
-- from its running head on and marks the key inflight: receive_partitioned
-- then defers every later event of it, and the chunk can be acknowledged.
-- settle_held_partitioned, when the key's lane finished, drops the copies of
-- the events it handled, retries or dead-letters the failed ones and puts
-- the rest of the group back into the log, in ev_id order (state releasing,
-- as after a pause). release_stale_holds_partitioned, called whenever a
-- worker starts working a slot, turns the holds left there into such a release,
-- the running head first, so a crash loses nothing and keeps per-key order.
-- Healthy keys never cause a write here.

-- Earlier forms took no proof of the chunk (epoch, batch) or epoch.
drop function if exists pgque.hold_key_partitioned(text, text, integer, integer, text, text, bigint);
drop function if exists pgque.settle_held_partitioned(text, text, integer, integer, text, text, bigint,
                                                      bigint[], bigint[], interval[], text[]);
-- Forms without the lease token.
drop function if exists pgque.hold_key_partitioned(text, text, integer, integer, text, bigint, bigint, text, bigint);
drop function if exists pgque.settle_held_partitioned(text, text, integer, integer, text, bigint, text, bigint,
                                                      bigint[], bigint[], interval[], text[]);
drop function if exists pgque.release_stale_holds_partitioned(text, text, integer, integer, text);

-- hold_key_partitioned(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, key, head): holds key (NULL is the NULL key) from its event
-- head on. head must be an event of key in the chunk the slot handed out
-- last, received under epoch in batch_id (_check_delivery: PQ032 when the
-- lease changed epoch since, PQ035 when that chunk is no longer the one out;
-- PQ022 when head is not an event of key there). Returns how many events
-- were deferred. hold_keys_partitioned (below) for one key. Tables:
-- sub_state (read), deferred (insert), key_block (upsert).
create or replace function pgque.hold_key_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                      i_nslots integer, i_worker text, i_token uuid,
                                                      i_epoch bigint, i_batch_id bigint,
                                                      i_key text, i_head bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_epoch is null or i_batch_id is null or i_head is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and head must not be NULL';
    end if;
    -- The caller's rights are checked there by session_user, as here.
    return pgque.hold_keys_partitioned(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token, i_epoch, i_batch_id,
                                       array[i_key], array[i_head]);
end;
$$;

-- hold_keys_partitioned(queue, consumer, slot, nslots, worker, token,
-- epoch, batch_id, keys, heads): hold_key_partitioned for several keys at
-- once, key i from heads[i] on, in one pass over the chunk instead of one
-- per key: what a worker that stops hands back (docs/design.md, "Key lanes
-- and holds"), often hundreds of keys of one chunk. keys and heads are
-- lists of the same length, at most 100 000, each key once (PQ011), every
-- head set (22004); the proof of the chunk and PQ022 are those of
-- hold_key_partitioned, for each head. Returns how many events were
-- deferred. Tables: as hold_key_partitioned.
create or replace function pgque.hold_keys_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                       i_nslots integer, i_worker text, i_token uuid,
                                                       i_epoch bigint, i_batch_id bigint,
                                                       i_keys text[], i_heads bigint[])
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l       pgque.slot_lease;
    st      pgque.sub_state;
    v_heads jsonb;
    v_found bigint[] := '{}';
    v_dup   text;
    v_kid   text;
    v_head  bigint;
    v_min   bigint;
    v_n     integer := 0;
    r       record;
    c       refcursor;
begin
    if i_epoch is null or i_batch_id is null or i_keys is null or i_heads is null then
        raise exception using errcode = '22004', message = 'epoch, batch id, keys and heads must not be NULL';
    end if;
    if array_ndims(i_keys) > 1 or array_ndims(i_heads) > 1
       or cardinality(i_keys) <> cardinality(i_heads) or cardinality(i_keys) > 100000 then
        raise exception using errcode = 'PQ011',
            message = format('keys and heads must be one-dimensional lists of the same length, at most 100000, not %s and %s',
                             cardinality(i_keys), cardinality(i_heads));
    end if;
    if array_position(i_heads, null) is not null then
        raise exception using errcode = '22004', message = 'heads must not be NULL';
    end if;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    if cardinality(i_keys) = 0 then
        return 0;
    end if;
    -- Built in one statement: a jsonb grown key by key is copied at each
    -- step, quadratic in the keys.
    select min(u.key) into v_dup
      from unnest(i_keys) u(key)
     group by pgque._kid(u.key) having count(*) > 1 limit 1;
    if found then
        raise exception using errcode = 'PQ011',
            message = format('key %s is given twice', pgque._key_label(v_dup));
    end if;
    select jsonb_object_agg(pgque._kid(u.key), u.head), min(u.head) into v_heads, v_min
      from unnest(i_keys, i_heads) u(key, head);
    st := pgque._check_delivery(l, i_epoch, i_batch_id, v_min);
    c := 'pgque_hold_' || st.st_batch;
    for r in select * from pgque._batch_cursor(st.st_batch, c::text, 2147483647,
                 concat_ws(' and ', pgque._slot_filter(i_slot, i_nslots),
                           'ev_id >= ' || v_min, 'ev_id <= ' || st.st_delivered_to)) loop
        v_kid := pgque._kid(r.ev_extra1);
        v_head := (v_heads ->> v_kid)::bigint;
        if v_head is not null and r.ev_id >= v_head then
            if r.ev_id = v_head then
                v_found := v_found || r.ev_id;
            end if;
            v_n := v_n + pgque._defer_row(l.sl_sub, v_kid, r.ev_id, r.ev_time, r.ev_retry, r.ev_type,
                                          r.ev_data, r.ev_extra1, r.ev_extra2, r.ev_extra3, r.ev_extra4);
        end if;
    end loop;
    close c;
    if cardinality(v_found) < cardinality(i_heads) then
        select u.key, u.head into v_kid, v_head
          from unnest(i_keys, i_heads) u(key, head)
         where u.head <> all (v_found) limit 1;
        raise exception using errcode = 'PQ022',
            message = format('event %s of key %s is not in the delivered part of batch %s of slot %s',
                             v_head, pgque._key_label(v_kid), st.st_batch, i_slot);
    end if;
    insert into pgque.key_block as kb (kb_sub, kb_kid, kb_key, kb_state, kb_head, kb_wait, kb_epoch)
    select l.sl_sub, pgque._kid(k.key), k.key, 'inflight', k.head, -1, l.sl_epoch
      from unnest(i_keys, i_heads) k(key, head)
    on conflict (kb_sub, kb_kid) do update
       set kb_state = 'inflight', kb_head = excluded.kb_head, kb_wait = -1, kb_wait_batch = null,
           kb_epoch = excluded.kb_epoch;
    return v_n;
end;
$$;

-- settle_held_partitioned(queue, consumer, slot, nslots, worker, token,
-- epoch, key, head, done, failed, retry_after, reasons): the lane of a key held
-- from head under epoch (the lease epoch its events were received under;
-- PQ032 when the lease is at another epoch now) finished. done are the held events it handled; failed (with one delay and
-- one reason each) the ones whose handler failed: each is retried, or
-- dead-lettered past max_retries or when its delay is NULL (as nack). Under pause, a retried failure blocks the
-- key (state blocked, as nack_partitioned would); otherwise the rest of the
-- key's deferred events is put back in ev_id order. Returns 1, or 0 when the
-- hold is no longer this epoch's (a new owner released it: the events are
-- redelivered). Tables: deferred, retry_queue, dead_letter, key_block.
create or replace function pgque.settle_held_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                         i_nslots integer, i_worker text, i_token uuid, i_epoch bigint,
                                                         i_key text, i_head bigint, i_done bigint[], i_failed bigint[],
                                                         i_retry_after interval[], i_reasons text[])
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l        pgque.slot_lease;
    v_kid    text := pgque._kid(i_key);
    b        pgque.key_block;
    d        pgque.deferred;
    q        pgque.queue;
    s        pgque.subscription;
    v_pause  boolean;
    v_block  bigint;
    v_reason text;
begin
    if i_head is null or i_epoch is null then
        raise exception using errcode = '22004', message = 'epoch and head must not be NULL';
    end if;
    if coalesce(cardinality(i_failed), 0) <> coalesce(cardinality(i_retry_after), 0)
       or coalesce(cardinality(i_failed), 0) <> coalesce(cardinality(i_reasons), 0) then
        raise exception using errcode = 'PQ011',
            message = 'failed, retry_after and reasons must have the same length';
    end if;
    for i in 1 .. coalesce(cardinality(i_failed), 0) loop
        if i_failed[i] is null then
            raise exception using errcode = '22004', message = 'failed events must not be NULL';
        end if;
        -- Bounded as nack bounds it (0 to 30 days of real duration), before
        -- anything adds it to a timestamp.
        if i_retry_after[i] is not null then
            perform pgque._check_interval('retry delay', i_retry_after[i], interval '0', interval '30 days');
        end if;
    end loop;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    if i_epoch <> l.sl_epoch then
        raise exception using errcode = 'PQ032',
            message = format('the key was held under epoch %s of slot %s of consumer %L; the lease is at epoch %s',
                             i_epoch, l.sl_slot, l.sl_consumer, l.sl_epoch);
    end if;
    select * into b from pgque.key_block where kb_sub = l.sl_sub and kb_kid = v_kid for update;
    if not found or b.kb_state <> 'inflight' or b.kb_head <> i_head or b.kb_epoch is distinct from i_epoch then
        return 0;
    end if;

    delete from pgque.deferred
     where ev_owner = l.sl_sub and ev_group = v_kid and ev_id = any(coalesce(i_done, '{}'));

    select sg_policy = 'pause' into v_pause from pgque.slot_group
     where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer;
    select * into s from pgque.subscription where sub_id = l.sl_sub;
    select * into q from pgque.queue where queue_id = s.sub_queue;
    for i in 1 .. coalesce(cardinality(i_failed), 0) loop
        delete from pgque.deferred
         where ev_owner = l.sl_sub and ev_group = v_kid and ev_id = i_failed[i]
        returning * into d;
        if not found then
            raise exception using errcode = 'PQ022',
                message = format('event %s is not held for key %s', i_failed[i], pgque._key_label(i_key));
        end if;
        if exists (select 1 from pgque.event_done dn where dn.dn_sub = l.sl_sub and dn.dn_ev_id = d.ev_id) then
            -- Completed in a transaction (complete_partitioned_in_tx) whose
            -- COMMIT the worker saw fail: the event is done, not retried.
            continue;
        end if;
        if i_retry_after[i] is null or pgque._retries(d.ev_retry) >= q.queue_max_retries then
            insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_retry,
                                           ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
            values (s.sub_queue, s.sub_name, left(i_reasons[i], 1000), d.ev_id, d.ev_time, pgque._retries(d.ev_retry),
                    d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4);
        else
            insert into pgque.retry_queue (ev_owner, ev_id, ev_queue, ev_retry_after, ev_time, ev_retry,
                                           ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
            values (l.sl_sub, d.ev_id, s.sub_queue, clock_timestamp() + i_retry_after[i], d.ev_time,
                    pgque._retried(d.ev_retry), d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4)
            on conflict (ev_owner, ev_id) do nothing;
            if v_pause and v_block is null then
                v_block := d.ev_id;
                v_reason := left(i_reasons[i], 1000);
            end if;
        end if;
    end loop;

    if v_block is not null then
        update pgque.key_block
           set kb_state = 'blocked', kb_head = v_block, kb_wait = v_block, kb_wait_batch = null,
               kb_epoch = null, kb_reason = v_reason,
               kb_failures = case when kb_head = v_block then kb_failures + 1 else 1 end
         where kb_sub = l.sl_sub and kb_kid = v_kid;
    else
        perform pgque._resolve_block(l.sl_sub, v_kid);
    end if;
    return 1;
end;
$$;

-- release_stale_holds_partitioned(queue, consumer, slot, nslots, worker,
-- token):
-- the caller, the slot's owner, starting to work the slot with no lane of
-- it running, releases every hold left on the slot — by an earlier owner,
-- or by itself before it lost and re-took the slot under the same epoch:
-- their deferred events, running head first, go back into the log.
-- Events of such a key deferred by a chunk the earlier owner never
-- acknowledged are left to that chunk, which is delivered again. Returns
-- how many events were put back (they are handled again).
-- Tables: sub_state (read), key_block, deferred, event.
create or replace function pgque.release_stale_holds_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                                 i_nslots integer, i_worker text, i_token uuid)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l    pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    b    record;
    st   pgque.sub_state := pgque._sub_state(l.sl_sub);
    r    record;
    c    refcursor;
    v_n  integer := 0;
begin
    -- The earlier owner may have received a chunk it never acknowledged:
    -- events of a held key it deferred there come again with that chunk,
    -- so their deferred copies are dropped rather than released twice.
    for b in select kb_kid, kb_key from pgque.key_block
              where kb_sub = l.sl_sub and kb_state = 'inflight'
              for update loop
        if st.st_batch is not null and st.st_delivered_to is not null then
            c := 'pgque_stale_' || st.st_batch;
            for r in select * from pgque._batch_cursor(st.st_batch, c::text, 2147483647,
                         concat_ws(' and ', pgque._slot_filter(i_slot, i_nslots), pgque._key_filter(b.kb_key),
                                   'ev_id > ' || coalesce(st.st_acked_to, -1), 'ev_id <= ' || st.st_delivered_to)) loop
                if r.ev_extra1 is not distinct from b.kb_key then
                    delete from pgque.deferred
                     where ev_owner = l.sl_sub and ev_group = b.kb_kid and ev_id = r.ev_id;
                end if;
            end loop;
            close c;
        end if;
        v_n := v_n + (select count(*) from pgque.deferred d where d.ev_owner = l.sl_sub and d.ev_group = b.kb_kid);
        perform pgque._resolve_block(l.sl_sub, b.kb_kid);
    end loop;
    return v_n;
end;
$$;
