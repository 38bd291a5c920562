-- _insert_event(queue, type, data, extra1..4): PgQ's write of a new
-- event. One lookup of the queue row, one INSERT into its current event
-- table; no other write, no lock beyond the insert's own. Static SQL, so
-- PL/pgSQL caches the plan. A queue confined for 'produce' also checks
-- the caller's grant. Returns the new ev_id.
-- The hot producers (insert_event below, the api layer's send and
-- send_batch, dedup's _dedup_send, table sources' triggers) write the
-- same INSERT themselves: a PL/pgSQL call per event is about a fifth of a
-- send's server time. What they share is named once: the event partition
-- (_part) and the ev_id taken after the transaction's id (_next_ev_id, in
-- pgque._util.sql). Retries, deferrals and moves (event_retry, the
-- partition layer's dead letters, pause and resize) copy existing events
-- and keep their ev_ids.
-- Not granted: callers are insert_event and the api layer's send.
create or replace function pgque._insert_event(
    i_queue text, i_type text, i_data text,
    i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns bigint language plpgsql
as $$
declare
    v_part integer;
    v_seq  regclass;
    v_id   bigint;
    v_confined boolean;
begin
    select pgque._part(queue_id, queue_cur_table), queue_event_seq, 'produce' = any (queue_confined)
      into v_part, v_seq, v_confined
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(pgque._part_queue(v_part), 'produce'); -- access check
    end if;
    if octet_length(i_data) > pgque._deliverable_bytes() then
        perform pgque._check_deliverable(i_data);
    end if;
    if pgque._fields_bytes(i_type, i_extra1, i_extra2, i_extra3, i_extra4) > pgque._deliverable_bytes() then
        perform pgque._check_fields('', 'event type and extra fields', i_type, i_extra1, i_extra2, i_extra3, i_extra4);
    end if;
    v_id := pgque._next_ev_id(v_seq);
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (v_id, v_part, i_type, i_data, i_extra1, i_extra2, i_extra3, i_extra4);
    return v_id;
end;
$$;

-- insert_event(queue, type, data[, extra1, extra2, extra3, extra4]): PgQ's
-- producer call. Returns the ev_id. PL/pgSQL with _insert_event's body
-- rather than a LANGUAGE sql wrapper around it: a SECURITY DEFINER SQL
-- function is never inlined and plans its statement on every call, and the
-- second PL/pgSQL layer costs as much again.
create or replace function pgque.insert_event(
    i_queue text, i_type text, i_data text,
    i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_part integer;
    v_seq  regclass;
    v_id   bigint;
    v_confined boolean;
begin
    select pgque._part(queue_id, queue_cur_table), queue_event_seq, 'produce' = any (queue_confined)
      into v_part, v_seq, v_confined
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(pgque._part_queue(v_part), 'produce'); -- access check
    end if;
    if octet_length(i_data) > pgque._deliverable_bytes() then
        perform pgque._check_deliverable(i_data);
    end if;
    if pgque._fields_bytes(i_type, i_extra1, i_extra2, i_extra3, i_extra4) > pgque._deliverable_bytes() then
        perform pgque._check_fields('', 'event type and extra fields', i_type, i_extra1, i_extra2, i_extra3, i_extra4);
    end if;
    v_id := pgque._next_ev_id(v_seq);
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (v_id, v_part, i_type, i_data, i_extra1, i_extra2, i_extra3, i_extra4);
    return v_id;
end;
$$;

create or replace function pgque.insert_event(i_queue text, i_type text, i_data text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    return pgque.insert_event(i_queue, i_type, i_data, null, null, null, null);
end;
$$;
