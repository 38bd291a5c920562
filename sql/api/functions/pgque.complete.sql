-- Transactional completion for plain subscriptions: complete_in_tx marks
-- one received event done for its consumer inside the caller's own
-- transaction, so that the caller's writes (the handler's effects) and the
-- mark commit or roll back together. A redelivered event whose mark exists
-- is refused (PQ038): the caller rolls back and counts it as done. See
-- docs/design.md, "Transactional handlers", and docs/sql-reference.md for
-- the call sequence.

-- _check_read_committed(): PQ011 unless the transaction is READ COMMITTED.
-- The completion checks the consumer's state as committed now; a REPEATABLE
-- READ snapshot could show a chunk as still open after another process
-- acknowledged it.
create or replace function pgque._check_read_committed()
returns void language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('complete an event in a READ COMMITTED transaction, not %s',
                             current_setting('transaction_isolation'));
    end if;
end;
$$;

-- _done_record(sub, batch, ev_id): appends the completion record, or raises
-- PQ038 when the event already has one (a redelivery of an event whose
-- handler committed). The record is looked for in both generations: a
-- crash can move the generation without a flip (a sequence is WAL-logged
-- ahead, so its value after recovery may have the other parity). The
-- whole table is locked (ROW EXCLUSIVE, which only a flip's ACCESS
-- EXCLUSIVE conflicts with) before that, so a flip either waits for this
-- transaction or committed before the lookup. A concurrent duplicate
-- (same generation: the generation changes only at a flip, which waits
-- for both, or at a crash, which ends both) waits on the unique index for
-- the first writer and is refused once that one commits. Tables:
-- event_done (read, insert).
create or replace function pgque._done_record(i_sub integer, i_batch bigint, i_ev_id bigint)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_n integer;
begin
    lock table pgque.event_done in row exclusive mode;
    if exists (select 1 from pgque.event_done where dn_sub = i_sub and dn_ev_id = i_ev_id) then
        v_n := 0;
    else
        insert into pgque.event_done (dn_sub, dn_batch, dn_ev_id) values (i_sub, i_batch, i_ev_id)
        on conflict do nothing;
        get diagnostics v_n = row_count;
    end if;
    if v_n = 0 then
        raise exception using errcode = 'PQ038',
            message = format('event %s was already completed', i_ev_id),
            hint = 'roll back: the event''s effects are committed already';
    end if;
end;
$$;

-- _refuse_done(sub, ev_id): PQ038 when the event was completed in a
-- transaction. A nack of it must not schedule a retry: the
-- retry, in a later batch, would apply its effects a second time. The nack
-- paths call it (one index probe, on failures only).
drop function if exists pgque._refuse_done(integer, bigint, bigint);
create or replace function pgque._refuse_done(i_sub integer, i_ev_id bigint)
returns void language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    if exists (select 1 from pgque.event_done
                where dn_sub = i_sub and dn_ev_id = i_ev_id) then
        raise exception using errcode = 'PQ038',
            message = format('event %s was completed in a transaction; it cannot be nacked', i_ev_id);
    end if;
end;
$$;

-- complete_in_tx(queue, consumer, batch_id, msg_id): marks event msg_id of
-- batch batch_id done for consumer, in the caller's transaction. The event
-- must be in the chunk the consumer handed out last and not acknowledged
-- (PQ039 otherwise: another process acknowledged that chunk). PQ038 when
-- the event was completed already. Takes a share lock on the subscription
-- row until the transaction ends, so the chunk cannot be acknowledged
-- (nor the next one received) before this completion commits or rolls
-- back: call it last, just before COMMIT. The caller must roll back on any
-- error, since its effects must not commit without the record. READ
-- COMMITTED only (PQ011). Tables: subscription (share lock), sub_state
-- (read), event_done (insert).
create or replace function pgque.complete_in_tx(i_queue text, i_consumer text, i_batch_id bigint, i_msg_id bigint)
returns void language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s  pgque.subscription;
    st pgque.sub_state;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._not_null('consumer name', i_consumer);
    perform pgque._refuse_slot(i_consumer);
    if i_batch_id is null or i_msg_id is null then
        raise exception using errcode = '22004', message = 'batch id and msg_id must not be NULL';
    end if;
    perform pgque._check_read_committed();
    s := pgque._subscription(i_queue, i_consumer);
    perform 1 from pgque.subscription where sub_id = s.sub_id for share;
    st := pgque._sub_state(s.sub_id);
    if st.st_batch is distinct from i_batch_id or st.st_delivered_to is null
       or i_msg_id > st.st_delivered_to or i_msg_id <= coalesce(st.st_acked_to, -1) then
        raise exception using errcode = 'PQ039',
            message = format('event %s of batch %s is not in the chunk consumer %L handed out last',
                             i_msg_id, i_batch_id, i_consumer),
            hint = 'roll back: the chunk was acknowledged already';
    end if;
    perform pgque._done_record(s.sub_id, i_batch_id, i_msg_id);
end;
$$;

-- _done_keep(gen): the completion records in generation gen still needed:
-- those of their subscription's open batch (which may be delivered again),
-- and those of events with a held copy in deferred (a lane's key held
-- across the chunk's ack: after a crash the copy is released, and the
-- release drops copies of completed events, _resolve_block). A finished
-- batch is never delivered again, and a completed event is never retried
-- (nacks refuse it), so no other record is consulted again.
create or replace function pgque._done_keep(i_gen integer)
returns setof pgque.event_done language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select d.*
      from pgque.event_done d
     where d.dn_gen = i_gen
       and (d.dn_batch = (select st.st_batch from pgque.sub_state st where st.st_sub = d.dn_sub
                           order by st.st_seq desc limit 1)
            or exists (select 1 from pgque.deferred x where x.ev_owner = d.dn_sub and x.ev_id = d.dn_ev_id))
$$;

-- _done_flip(): retires the current completion generation, keeping the
-- records of open batches. Skipped when the generation holds nothing else.
-- Waits at most 200 ms for the retired partition's lock (a completing
-- transaction holds it until it ends) and otherwise tries again at the
-- next maint(). Returns 1 when flipped. Not granted: maint() calls it as a
-- layer hook. Tables: done_rotation (lock), event_done (insert, truncate).
create or replace function pgque._done_flip()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur integer;
begin
    perform 1 from pgque.done_rotation for update skip locked;
    if not found then
        return 0;
    end if;
    v_cur := pgque._done_gen();
    if (select count(*) from pgque.event_done where dn_gen = v_cur)
       <= (select count(*) from pgque._done_keep(v_cur)) then
        return 0;
    end if;
    if not pgque._flip_lock('pgque.event_done_' || v_cur) then
        return 0;
    end if;
    perform nextval('pgque.done_gen_seq');
    insert into pgque.event_done (dn_sub, dn_batch, dn_ev_id, dn_gen)
    select k.dn_sub, k.dn_batch, k.dn_ev_id, 1 - v_cur from pgque._done_keep(v_cur) k;
    execute format('truncate %s', 'pgque.event_done_' || v_cur);
    return 1;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'done_flip', 'pgque._done_flip()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;
