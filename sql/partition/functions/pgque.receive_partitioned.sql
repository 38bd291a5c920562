-- Consuming a slot. Each call first proves the caller holds the slot's
-- lease (and renews it), then delivers through the api layer with the
-- slot's routing predicate. The epoch is returned with every row as a
-- fencing token for the handler's side effects. The lease token claim_slot
-- returned is the caller's credential: every function here takes it after
-- the worker id.

-- Forms without a lease token, and the acknowledgement without a proof of
-- the chunk (removed: use the fenced ack_partitioned with the token).
drop function if exists pgque.receive_partitioned(text, text, integer, integer, text, integer);
drop function if exists pgque.ack_partitioned(text, text, integer, integer, text);
drop function if exists pgque.ack_partitioned(text, text, integer, integer, text, bigint, bigint, bigint);
drop function if exists pgque.nack_partitioned(text, text, integer, integer, text, bigint, interval, text);
drop function if exists pgque.nack_partitioned(text, text, integer, integer, text, bigint, bigint, bigint, interval, text);
drop function if exists pgque._fenced_lease(text, text, integer, integer, text, bigint, bigint, bigint);

-- _receive_slot(queue, consumer, lease, slot, nslots, max): the body of
-- both receive forms, for a caller that proved the lease of slot of nslots:
-- the next chunk of the slot's open batch, events of this slot only, in
-- ev_id order, payload as stored (text). Not granted.
create or replace function pgque._receive_slot(i_queue text, i_consumer text, l pgque.slot_lease,
                                               i_slot integer, i_nslots integer, i_max integer)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_sub    text := pgque._slot_name(i_consumer, i_slot, i_nslots);
    r        record;
    v_batch  bigint;
    v_out    integer;
    v_round  integer := 0;
    v_kids   text[];
begin
    -- Fast path: no blocked key on this slot (always so under skip).
    if not exists (select 1 from pgque.key_block where kb_sub = l.sl_sub) then
        return query select d.* from pgque._deliver_raw(i_queue, v_sub, i_max, i_slot, i_nslots, i_max::bigint * i_nslots) d;
        if not found then
            -- A sealed slot with nothing left may complete a resize.
            perform pgque._resize_poll(l);
        end if;
        return;
    end if;
    -- Pause with blocked keys: defer what must wait; a chunk that was all
    -- deferred is acknowledged here and the next one is fetched. The slot's
    -- blocked keys are read once per call, so rows of healthy keys cost one
    -- array test, not a lookup. The chunk is read whole (a function scan
    -- runs _deliver_raw to its end) before any of it is deferred.
    perform pgque._release_pending(l.sl_sub);
    v_kids := array(select kb_kid from pgque.key_block where kb_sub = l.sl_sub);
    loop
        v_batch := null;
        v_out := 0;
        for r in select * from pgque._deliver_raw(i_queue, v_sub, i_max, i_slot, i_nslots, i_max::bigint * i_nslots) loop
            v_batch := r.batch_id;
            if not ((case when r.partition_key is null then 'n'
                             when octet_length(r.partition_key) <= 512 then 'k' || r.partition_key
                             else pgque._kid_long(r.partition_key) end) = any(v_kids))
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
                return next;
                v_out := v_out + 1;
            else
                perform pgque._defer_row(l.sl_sub, pgque._kid(r.partition_key), r.msg_id, r.created_at,
                                         r.retry_count, r.type, r.payload, r.partition_key,
                                         r.extra2, r.extra3, r.extra4);
            end if;
        end loop;
        if v_batch is null then
            perform pgque._resize_poll(l);
        end if;
        if v_batch is null or v_out > 0 then
            return;
        end if;
        perform pgque._ack(v_batch);
        v_round := v_round + 1;
        exit when v_round >= 100;
    end loop;
end;
$$;

-- receive_partitioned(queue, consumer, slot, nslots, worker, token, max):
-- the next chunk of the slot's open batch: events of this slot only, in
-- ev_id order, payload as jsonb (data that is not JSON, which only
-- insert_event can store, becomes a JSON string; see _payload).
create or replace function pgque.receive_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                     i_nslots integer, i_worker text, i_token uuid,
                                                     i_max integer default 100)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text,
               epoch bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l        pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    v_rows   pgque.message[];
begin
    -- The chunk is made whole before it is returned: a payload that is
    -- not JSON fails the cast, and the chunk is read again (its state
    -- change was rolled back with the cast) with such payloads as strings.
    begin
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, d.payload::jsonb, d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._receive_slot(i_queue, i_consumer, l, i_slot, i_nslots, i_max) d);
    exception when data_exception or program_limit_exceeded then
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, pgque._payload(d.payload), d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._receive_slot(i_queue, i_consumer, l, i_slot, i_nslots, i_max) d);
    end;
    return query select m.*, l.sl_epoch from unnest(v_rows) m;
end;
$$;

-- receive_partitioned_raw(queue, consumer, slot, nslots, worker, token,
-- max[, ack_epoch, ack_batch_id, ack_msg_id]): receive_partitioned with
-- the payload as stored, and an optional acknowledgement first; in
-- pgque.receive_partitioned_raw.gen.sql, generated with _deliver_raw from
-- sql/templates/deliver_raw.sql.tmpl. The form without the ack arguments:
-- calls with seven or fewer arguments now resolve to the one with them.
drop function if exists pgque.receive_partitioned_raw(text, text, integer, integer, text, uuid, integer);

-- _slot_batch(lease): the slot's open batch, or PQ020.
create or replace function pgque._slot_batch(l pgque.slot_lease)
returns bigint language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch bigint;
begin
    v_batch := (pgque._sub_state(l.sl_sub)).st_batch;
    if v_batch is null then
        raise exception using errcode = 'PQ020',
            message = format('slot %s of consumer %L has no open batch', l.sl_slot, l.sl_consumer);
    end if;
    return v_batch;
end;
$$;

-- _in_chunk(state, batch, msg_id): whether msg_id of batch is in the chunk
-- that state says the slot handed out last and has not acknowledged: the
-- test of _check_delivery's PQ035, in one place. An SQL-standard body,
-- inlined into its callers' statements: receive_partitioned_raw tests a
-- folded acknowledgement with it under the subscription's lock and calls
-- _check_delivery, which raises, only when it fails. NULL is false.
create or replace function pgque._in_chunk(st pgque.sub_state, i_batch bigint, i_msg_id bigint)
returns boolean language sql immutable
return coalesce(not (st.st_batch is distinct from i_batch or st.st_delivered_to is null
                     or i_msg_id > st.st_delivered_to or i_msg_id <= coalesce(st.st_acked_to, -1)), false);

-- _check_delivery(lease, epoch, batch, msg_id): proves that the caller
-- settles the chunk the slot handed out last: its lease epoch is the
-- current one (PQ032 otherwise: the lease changed hands since it
-- received), and msg_id, an event it received, is in the slot's current
-- delivered chunk of batch (PQ035 otherwise: that chunk was acknowledged
-- already, possibly by another owner, and a newer one is out). Returns the
-- state.
create or replace function pgque._check_delivery(l pgque.slot_lease, i_epoch bigint, i_batch bigint, i_msg_id bigint)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_epoch is null or i_batch is null or i_msg_id is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and msg_id must not be NULL';
    end if;
    if i_epoch <> l.sl_epoch then
        raise exception using errcode = 'PQ032',
            message = format('the chunk was received under epoch %s of slot %s of consumer %L; the lease is at epoch %s',
                             i_epoch, l.sl_slot, l.sl_consumer, l.sl_epoch);
    end if;
    st := pgque._sub_state(l.sl_sub);
    if not pgque._in_chunk(st, i_batch, i_msg_id) then
        raise exception using errcode = 'PQ035',
            message = format('event %s of batch %s is not in the chunk slot %s of consumer %L handed out last',
                             i_msg_id, i_batch, l.sl_slot, l.sl_consumer);
    end if;
    return st;
end;
$$;

-- _fenced_lease(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, msg_id): what the fenced ack and nack check first: their proof
-- is complete (22004), the caller may consume the queue, holds the lease
-- (its token proves it, PQ085 otherwise), and received the chunk it names
-- (_check_delivery). Returns the locked lease.
create or replace function pgque._fenced_lease(i_queue text, i_consumer text, i_slot integer,
                                               i_nslots integer, i_worker text, i_token uuid,
                                               i_epoch bigint, i_batch_id bigint, i_msg_id bigint)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    if i_epoch is null or i_batch_id is null or i_msg_id is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and msg_id must not be NULL';
    end if;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    perform pgque._check_delivery(l, i_epoch, i_batch_id, i_msg_id);
    return l;
end;
$$;

-- ack_partitioned(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, msg_id): acknowledges the chunk the last receive_partitioned
-- returned, after _check_delivery proved it is the chunk the caller
-- received (epoch and batch_id from its rows, msg_id any of its events).
-- Returns 1 when the batch is finished, 0 when more of it remains.
create or replace function pgque.ack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                 i_nslots integer, i_worker text, i_token uuid,
                                                 i_epoch bigint, i_batch_id bigint, i_msg_id bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    l := pgque._fenced_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token, i_epoch, i_batch_id, i_msg_id);
    return pgque._ack_slot(l);
end;
$$;

-- _ack_slot(lease): the acknowledgement of the slot's chunk, with the
-- pause policy's bookkeeping. (Its slot arguments went with _ack's
-- predicate, which never used them.)
drop function if exists pgque._ack_slot(pgque.slot_lease, integer, integer);
create or replace function pgque._ack_slot(l pgque.slot_lease)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch bigint := pgque._slot_batch(l);
    v_done  integer;
begin
    v_done := pgque._ack(v_batch);
    if exists (select 1 from pgque.key_block where kb_sub = l.sl_sub) then
        perform pgque._pause_on_ack(l.sl_sub, v_batch);
    end if;
    return v_done;
end;
$$;

-- nack_partitioned(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, msg_id, retry_after, reason): the fenced form: _check_delivery
-- proves msg_id is in the chunk the caller received under epoch. A NULL
-- retry_after dead-letters the event at once, as in the unfenced form.
create or replace function pgque.nack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                  i_nslots integer, i_worker text, i_token uuid,
                                                  i_epoch bigint, i_batch_id bigint, i_msg_id bigint,
                                                  i_retry_after interval, i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    l := pgque._fenced_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token, i_epoch, i_batch_id, i_msg_id);
    return pgque._nack_slot(l, i_slot, i_nslots, i_msg_id, i_retry_after, i_reason);
end;
$$;

-- nack_partitioned(queue, consumer, slot, nslots, worker, token, msg_id,
-- retry_after, reason): schedules one received event for redelivery to
-- this slot only, or dead-letters it past max_retries. Returns 1 or 0 as
-- nack. The event must be one of this slot's events in the chunk the slot
-- handed out last (PQ022 otherwise); the token ties the call to the
-- current holder, who alone received that chunk.
create or replace function pgque.nack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                  i_nslots integer, i_worker text, i_token uuid, i_msg_id bigint,
                                                  i_retry_after interval, i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    return pgque._nack_slot(pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token),
                            i_slot, i_nslots, i_msg_id, i_retry_after, i_reason);
end;
$$;

-- _nack_slot(lease, slot, nslots, msg_id, retry_after, reason): the nack of
-- both forms. PQ038 when the event was completed in a transaction.
create or replace function pgque._nack_slot(l pgque.slot_lease, i_slot integer, i_nslots integer,
                                            i_msg_id bigint, i_retry_after interval, i_reason text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch  bigint := pgque._slot_batch(l);
    v_filter text := pgque._slot_filter(i_slot, i_nslots);
    st       pgque.sub_state := pgque._sub_state(l.sl_sub);
    v_pause  boolean;
    v_key    text;
    v_retried integer;
    c        refcursor := 'pgque_nack_' || v_batch;
begin
    if i_msg_id is null then
        raise exception using errcode = '22004', message = 'msg_id must not be NULL';
    end if;
    select sg_policy = 'pause' into v_pause from pgque.slot_group
     where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer;
    -- Only an event this slot handed out in its current chunk can be
    -- nacked: another slot's event, or one not delivered yet, would get a
    -- retry copy that no consumer ever receives.
    select g.ev_extra1 into v_key
      from pgque._batch_cursor(v_batch, c::text, 1,
               concat_ws(' and ', v_filter, 'ev_id = ' || i_msg_id,
                         'ev_id <= ' || coalesce(st.st_delivered_to, -1),
                         'ev_id > ' || coalesce(st.st_acked_to, -1))) g;
    if not found then
        close c;
        raise exception using errcode = 'PQ022',
            message = format('event %s is not in the chunk slot %s handed out last of batch %s', i_msg_id, i_slot, v_batch);
    end if;
    close c;
    perform pgque._refuse_done(l.sl_sub, i_msg_id);
    v_retried := pgque._event_retry(v_batch, i_msg_id, i_retry_after, i_reason);
    if v_pause then
        perform pgque._pause_on_nack(l, i_nslots, v_batch, i_msg_id, v_key, v_retried = 1, i_reason);
    end if;
    return v_retried;
end;
$$;
