-- The pause failure policy (G3).
--
-- Under pause, when the head event of key K fails on a slot, K is blocked
-- on that slot: later events of K, in the same chunk or later batches, are
-- deferred through the engine's event_defer primitive (not delivered, not
-- dropped, not counted as retries) while every other key keeps flowing and
-- the slot's cursor keeps moving. When the head succeeds on a retry, or is
-- dead-lettered, the deferred events are put back and delivered in ev_id
-- order before any newer event of K. The state is one key_block row per
-- blocked key; healthy events cost a read of key_block only while the slot
-- has a blocked key, and no write ever.

-- _kid(key): the key spelled so that NULL is a key of its own: 'n' for
-- NULL, 'k' || key for a key of at most 512 bytes, and for a longer one
-- 'h' || the hex SHA-256 of its bytes (_kid_long). kb_kid and ev_group are
-- indexed (key_block's primary key, deferred_group_idx), and a btree entry
-- holds at most about 2.7 kB: a partition key is any text a writer (or a
-- table source's writer) sends, and spelled whole, a long one made the
-- pause policy's nack and the lanes' key hold fail with 54000 at every
-- attempt, so that its slot (every key in it) could never be settled.
-- The readers that test a key against kb_kid inline the short case and
-- call this for the rest.
create or replace function pgque._kid_long(i_key text)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$ select 'h' || encode(sha256(convert_to(i_key, getdatabaseencoding())), 'hex') $$;

create or replace function pgque._kid(i_key text)
returns text language sql immutable
as $$ select case when i_key is null then 'n'
                  when pg_catalog.octet_length(i_key) operator(pg_catalog.<=) 512 then 'k' operator(pg_catalog.||) i_key
                  else pgque._kid_long(i_key) end $$;

-- Blocks and deferrals of long keys recorded before they were hashed (the
-- ones whose index entry fitted) take the spelling _kid gives now.
update pgque.key_block set kb_kid = pgque._kid(kb_key)
 where octet_length(kb_kid) > 513 and kb_kid = 'k' || kb_key;
update pgque.deferred set ev_group = pgque._kid(ev_extra1)
 where octet_length(ev_group) > 513 and ev_group = 'k' || ev_extra1;

-- _key_filter(key): a predicate selecting the key's events, built from an
-- integer (the key's hash) so no caller string enters SQL text; callers
-- re-check the exact key on each row.
create or replace function pgque._key_filter(i_key text)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select case when i_key is null then 'ev_extra1 is null'
                else 'pg_catalog.hashtextextended(ev_extra1, 0) = ' || hashtextextended(i_key, 0) end
$$;

-- _resolve_block(sub, kid): the awaited event of a blocked or releasing key
-- was acknowledged or dead-lettered: put the deferred events back (state
-- releasing until the last of them is acknowledged), or drop the block
-- when nothing is deferred.
--
-- While the slot's batch is open, only the deferred events up to its
-- acknowledged position are put back. The batch's later events are still
-- to come, and an event put back goes to a later batch: a later event of
-- the key still in the open batch, with a smaller ev_id than a deferred
-- one, would otherwise be handed out first (deferred events come from
-- earlier batches too, and put-back events of a batch are mixed with newer
-- ones). Those later events are above the position, so they are deferred
-- behind what was put back. When nothing could be put back yet, the block
-- stays releasing with kb_wait -1 (every event of the key is deferred) and
-- receive_partitioned resolves it again (_release_pending) as the batch
-- moves on. Tables: sub_state (read), deferred, event, key_block.
create or replace function pgque._resolve_block(i_sub integer, i_kid text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st      pgque.sub_state := pgque._sub_state(i_sub);
    v_bound bigint := case when st.st_batch is null then null else coalesce(st.st_acked_to, -1) end;
    v_count integer;
    v_max   bigint;
begin
    with moved as (
        delete from pgque.deferred d
         where d.ev_owner = i_sub and d.ev_group = i_kid and (v_bound is null or d.ev_id <= v_bound)
        returning d.*
    ), ins as (
        insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                                 ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        select m.ev_id, m.ev_time, pgque._part(q.queue_id, q.queue_cur_table), m.ev_owner, m.ev_retry,
               m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4
          from moved m join pgque.queue q on q.queue_id = m.ev_queue
         -- A held event its lane completed in a transaction is done: its
         -- copy is dropped, not delivered again.
         where not exists (select 1 from pgque.event_done dn where dn.dn_sub = m.ev_owner and dn.dn_ev_id = m.ev_id)
        returning ev_id
    )
    select count(*), max(ins.ev_id) into v_count, v_max from ins;
    if v_count > 0 then
        -- Let the ticker see pending work, as _undefer does.
        perform nextval(q.queue_event_seq)
           from pgque.queue q join pgque.subscription s on s.sub_queue = q.queue_id
          where s.sub_id = i_sub;
        update pgque.key_block
           set kb_state = 'releasing', kb_wait = v_max, kb_wait_batch = null
         where kb_sub = i_sub and kb_kid = i_kid;
    elsif exists (select 1 from pgque.deferred d where d.ev_owner = i_sub and d.ev_group = i_kid) then
        update pgque.key_block
           set kb_state = 'releasing', kb_wait = -1, kb_wait_batch = null
         where kb_sub = i_sub and kb_kid = i_kid;
    else
        delete from pgque.key_block where kb_sub = i_sub and kb_kid = i_kid;
    end if;
end;
$$;

-- _release_pending(sub): resolves again the blocks that are releasing with
-- nothing put back yet (kb_wait -1), once the slot's batch moved on.
-- Tables: key_block, and those of _resolve_block.
create or replace function pgque._release_pending(i_sub integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_kid text;
begin
    for v_kid in select kb_kid from pgque.key_block
                  where kb_sub = i_sub and kb_state = 'releasing' and kb_wait = -1 loop
        perform pgque._resolve_block(i_sub, v_kid);
    end loop;
end;
$$;

-- _pause_on_ack(sub, batch): resolves the blocks whose awaited event was
-- handed out in the batch whose chunk was just acknowledged.
create or replace function pgque._pause_on_ack(i_sub integer, i_batch bigint)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_kid text;
begin
    for v_kid in select kb_kid from pgque.key_block
                  where kb_sub = i_sub and kb_wait_batch = i_batch loop
        perform pgque._resolve_block(i_sub, v_kid);
    end loop;
end;
$$;

-- _key_label(key): a partition key as the layer's error messages quote it: the
-- literal of its first 200 characters, then "…" and its length in bytes
-- when it is longer, or NULL. A key is any text a writer sends (up to
-- _deliverable_bytes() with its event's type), and a message quoting it
-- whole was megabytes long in every log line that reported it.
create or replace function pgque._key_label(i_key text)
returns text language sql immutable
return coalesce(quote_literal(left(i_key, 200))
                || case when length(i_key) > 200 then format('… (%s bytes)', octet_length(i_key)) else '' end,
                'NULL');

-- _pause_on_nack(lease, batch, msg_id, key, retried, reason): the handler
-- failed on msg_id of key. Defers the rest of the key in the chunk already
-- handed out (the worker skipped them), then blocks the key with msg_id as
-- its head, or, when the head was dead-lettered, resolves at once.
create or replace function pgque._pause_on_nack(l pgque.slot_lease, i_nslots integer, i_batch bigint,
                                                i_msg_id bigint, i_key text, i_retried boolean,
                                                i_reason text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_kid  text := pgque._kid(i_key);
    v_upto bigint;
    r      record;
    c      refcursor := 'pgque_pause_' || i_batch;
begin
    select st_delivered_to into v_upto from pgque._sub_state(l.sl_sub) where st_batch = i_batch;
    if v_upto is not null and v_upto > i_msg_id then
        for r in select * from pgque._batch_cursor(i_batch, c::text, 2147483647,
                     concat_ws(' and ', pgque._slot_filter(l.sl_slot, i_nslots), pgque._key_filter(i_key),
                               'ev_id > ' || i_msg_id, 'ev_id <= ' || v_upto)) loop
            if r.ev_extra1 is not distinct from i_key then
                perform pgque._defer_row(l.sl_sub, v_kid, r.ev_id, r.ev_time, r.ev_retry, r.ev_type, r.ev_data,
                                         r.ev_extra1, r.ev_extra2, r.ev_extra3, r.ev_extra4);
            end if;
        end loop;
        close c;
    end if;

    insert into pgque.key_block as kb (kb_sub, kb_kid, kb_key, kb_state, kb_head, kb_wait, kb_failures, kb_reason)
    values (l.sl_sub, v_kid, i_key, 'blocked', i_msg_id, i_msg_id, 1, left(i_reason, 1000))
    on conflict (kb_sub, kb_kid) do update
       set kb_state = 'blocked', kb_head = excluded.kb_head, kb_wait = excluded.kb_wait,
           kb_wait_batch = null, kb_reason = excluded.kb_reason,
           kb_failures = case when kb.kb_head = excluded.kb_head then kb.kb_failures + 1 else 1 end;
    if not i_retried then
        perform pgque._resolve_block(l.sl_sub, v_kid);
    end if;
end;
$$;

-- _pause_keep(sub, batch, msg_id, key): whether a row handed out under
-- pause is delivered (true) or deferred (false); records when the awaited
-- event of a blocked key is handed out.
create or replace function pgque._pause_keep(i_sub integer, i_batch bigint, i_msg_id bigint, i_key text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block;
begin
    select * into b from pgque.key_block where kb_sub = i_sub and kb_kid = pgque._kid(i_key);
    if not found then
        return true;
    end if;
    if i_msg_id = b.kb_wait then
        update pgque.key_block set kb_wait_batch = i_batch where kb_sub = i_sub and kb_kid = b.kb_kid;
        return true;
    end if;
    -- Blocked: only the head's retry passes. Releasing: the events put back
    -- (up to kb_wait) pass in ev_id order; newer ones wait for the next round.
    return b.kb_state = 'releasing' and i_msg_id < b.kb_wait;
end;
$$;

-- set_failure_policy(queue, consumer, policy): 'skip' or 'pause' for all
-- slots of a consumer. Switching to skip releases every blocked key (a key
-- held while its lane runs stays held until the lane settles it). Returns 1.
create or replace function pgque.set_failure_policy(i_queue text, i_consumer text, i_policy text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    b record;
begin
    if i_policy is null or i_policy not in ('skip', 'pause') then
        raise exception using errcode = 'PQ011',
            message = format('failure policy must be ''skip'' or ''pause'', not %s', coalesce(quote_literal(i_policy), 'NULL'));
    end if;
    update pgque.slot_group set sg_policy = i_policy where sg_queue = q.queue_id and sg_consumer = i_consumer;
    if not found then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    if i_policy = 'skip' then
        for b in select kb.kb_sub, kb.kb_kid from pgque.key_block kb join pgque.slot_lease l on l.sl_sub = kb.kb_sub
                  where l.sl_queue = q.queue_id and l.sl_consumer = i_consumer
                    and kb.kb_state <> 'inflight' loop
            perform pgque._undefer(b.kb_sub, b.kb_kid);
            delete from pgque.key_block where kb_sub = b.kb_sub and kb_kid = b.kb_kid;
        end loop;
    end if;
    return 1;
end;
$$;

-- blocked_keys(queue, consumer): the blocked keys of a consumer's slots:
-- slot, key, state, head ev_id, since, failures so far, last reason, and
-- how many events are deferred behind the head. State is 'blocked' (the
-- head failed and waits for its retry), 'releasing' (the head was settled
-- and the deferred events are being put back) or 'held' (the key is held
-- while its lane runs; key_block stores it as 'inflight'). 42501 for a login that
-- may not read a confined queue (_authorize_read); PQ034 for a consumer
-- the queue has no slots of (a misspelt name would otherwise read as
-- "nothing is blocked"), as key_heads and slot_group_info.
create or replace function pgque.blocked_keys(i_queue text, i_consumer text default null)
returns table (queue text, consumer text, slot integer, key text, state text, head_ev_id bigint,
               since timestamptz, failures integer, reason text, deferred bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_ok boolean := pgque._authorize_read(i_queue);
    q pgque.queue := pgque._queue(i_queue);
begin
    if i_consumer is not null then
        perform pgque._slot_group(i_queue, i_consumer, null); -- PQ034 without slots
    end if;
    return query
    select q.queue_name, l.sl_consumer, l.sl_slot, kb.kb_key,
           case kb.kb_state when 'inflight' then 'held' else kb.kb_state end, kb.kb_head, kb.kb_since,
           kb.kb_failures, kb.kb_reason,
           (select count(*) from pgque.deferred d where d.ev_owner = kb.kb_sub and d.ev_group = kb.kb_kid)
      from pgque.key_block kb
      join pgque.slot_lease l on l.sl_sub = kb.kb_sub
     where l.sl_queue = q.queue_id and (i_consumer is null or l.sl_consumer = i_consumer)
     order by l.sl_consumer, l.sl_slot, kb.kb_since;
end;
$$;

drop function if exists pgque._slot_consumer(pgque.queue, text);

-- _blocked(queue, consumer, key): the block row of a key, PQ034 for a
-- consumer the queue has no slots of, or PQ036 (not blocked).
create or replace function pgque._blocked(i_queue text, i_consumer text, i_key text)
returns pgque.key_block language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block;
begin
    select kb.* into b
      from pgque.key_block kb
      join pgque.slot_lease l on l.sl_sub = kb.kb_sub
      join pgque.queue q on q.queue_id = l.sl_queue
     where q.queue_name = i_queue and l.sl_consumer = i_consumer and kb.kb_kid = pgque._kid(i_key)
       for update of kb;
    if not found then
        perform pgque._queue(i_queue);
        if i_consumer is not null then
            perform pgque._slot_group(i_queue, i_consumer, null); -- PQ034 without slots
        end if;
        raise exception using errcode = 'PQ036',
            message = format('key %s is not blocked for consumer %L on queue %L',
                             pgque._key_label(i_key), i_consumer, i_queue);
    end if;
    return b;
end;
$$;

-- unblock_key(queue, consumer, key): dead-letters the head of a blocked key
-- (its pending retry) and releases the events deferred behind it. Raises
-- PQ036 when the key is not blocked (or is already releasing) and PQ037
-- when its head is being redelivered right now (try again after that
-- delivery). Returns the dead-lettered ev_id.
create or replace function pgque.unblock_key(i_queue text, i_consumer text, i_key text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block := pgque._blocked(i_queue, i_consumer, i_key);
    r pgque.retry_queue;
    s pgque.subscription;
begin
    if b.kb_state <> 'blocked' then
        raise exception using errcode = 'PQ036',
            message = format('key %s is not blocked by a failing head (it is %s)', pgque._key_label(i_key),
                             case b.kb_state when 'inflight' then 'held' else b.kb_state end);
    end if;
    delete from pgque.retry_queue where ev_owner = b.kb_sub and ev_id = b.kb_head returning * into r;
    if not found then
        raise exception using errcode = 'PQ037',
            message = format('the head %s of key %s is being redelivered; try again once it was handled',
                             b.kb_head, pgque._key_label(i_key));
    end if;
    select * into s from pgque.subscription where sub_id = b.kb_sub;
    insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (s.sub_queue, s.sub_name, coalesce('unblocked by an operator; last failure: ' || b.kb_reason, 'unblocked by an operator'),
            r.ev_id, r.ev_time, pgque._retries(r.ev_retry), r.ev_type, r.ev_data, r.ev_extra1, r.ev_extra2, r.ev_extra3, r.ev_extra4);
    perform pgque._resolve_block(b.kb_sub, b.kb_kid);
    return r.ev_id;
end;
$$;

-- retry_key_now(queue, consumer, key): makes the pending retry of a blocked
-- key's head due now and moves it back into the log. Returns 1 when there
-- was a pending retry, 0 otherwise.
create or replace function pgque.retry_key_now(i_queue text, i_consumer text, i_key text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block := pgque._blocked(i_queue, i_consumer, i_key);
begin
    update pgque.retry_queue set ev_retry_after = clock_timestamp()
     where ev_owner = b.kb_sub and ev_id = b.kb_head;
    if not found then
        return 0;
    end if;
    perform pgque.maint_retry_events();
    return 1;
end;
$$;
