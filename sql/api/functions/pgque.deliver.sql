-- Chunked delivery of batches: what every receive shares with the read
-- path (pgque.deliver_raw.sql): the acknowledgement (_ack), the payload
-- as jsonb (_payload) and the chunk's byte budget (_chunk_bytes).
--
-- A batch is handed out in chunks of at most max rows in ev_id order. A
-- chunk is redelivered until it is acknowledged (at-least-once, no session
-- state). Acknowledging the chunk that reaches the batch's end finishes the
-- batch; the batch can never be finished past rows nobody received.
-- Batches that hold nothing for the consumer are finished at once, so its
-- cursor keeps moving. _ack reaches the engine through its internal batch
-- function _finish.

-- Removed: _deliver, the delivery by a predicate given as SQL text (every
-- receive runs _deliver_raw), its helper _and, and _ack's predicate
-- argument, which it never used.
drop function if exists pgque._deliver(text, text, integer, text);
drop function if exists pgque._deliver(text, text, integer, text, bigint);
drop function if exists pgque._and(text, bigint);
drop function if exists pgque._ack(bigint, text);

-- _payload(data): the event data as jsonb; data that cannot be read as
-- jsonb (not JSON, or JSON that jsonb refuses: a \u0000 escape, a number out
-- of range, nesting past the stack limit) is returned as a JSON string of
-- the stored text rather than failing the whole chunk. Only insert_event
-- can store such data; send stores JSON.
create or replace function pgque._payload(i_data text)
returns jsonb language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    return i_data::jsonb;
exception when others then
    return to_jsonb(i_data);
end;
$$;

-- _chunk_bytes(): the byte budget of one chunk (sum of the events' data,
-- types, keys and extra fields). A chunk holds at least one event, so a
-- single event larger than the budget is delivered alone; otherwise its
-- events' texts add up to at most the budget.
create or replace function pgque._chunk_bytes()
returns bigint language sql immutable
as $$ select 33554432::bigint $$;

-- _ack(batch_id): acknowledges the chunk the last delivery handed out.
-- Returns 1 when that finished the batch, 0 when rows remain (or nothing
-- had been handed out). Whether rows remain was recorded by the delivery
-- (it looked one event past the chunk), so the batch is never finished
-- past rows nobody received.
-- Tables: sub_state (insert), subscription (lock).
create or replace function pgque._ack(i_batch_id bigint)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    st := pgque._lock_sub(pgque._batch_sub(i_batch_id));
    if st.st_batch is distinct from i_batch_id then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    if st.st_delivered_to is null then
        return 0;
    end if;
    if not st.st_delivered_all then
        st.st_acked_to := st.st_delivered_to;
        st.st_delivered_to := null;
        perform pgque._put_state(st);
        return 0;
    end if;
    perform pgque._finish(st);
    return 1;
end;
$$;
