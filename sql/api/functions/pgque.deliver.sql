-- Chunked delivery of batches: the acknowledgement (_ack) shared by every
-- receive, and the text-predicate form of delivery (_deliver).
--
-- A batch is handed out in chunks of at most max rows in ev_id order. A
-- chunk is redelivered until it is acknowledged (at-least-once, no session
-- state). Acknowledging the chunk that reaches the batch's end finishes the
-- batch; the batch can never be finished past rows nobody received.
-- Batches that hold nothing for the consumer are finished at once, so its
-- cursor keeps moving. Both functions reach the engine through its
-- internal batch functions (_open_batch, _batch_rows, _finish); i_where is
-- a trusted predicate (NULL, or built by the partition layer from integers).

-- _and(where, after): i_where combined with "ev_id > after".
create or replace function pgque._and(i_where text, i_after bigint)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select case
        when i_after is null then i_where
        when i_where is null then 'ev_id > ' || i_after
        else '(' || i_where || ') and ev_id > ' || i_after
    end
$$;

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

-- _chunk_bytes(): the byte budget of one chunk (sum of the events' data).
-- A chunk holds at least one event, so a single event larger than the
-- budget is delivered alone; otherwise its events' data add up to at most
-- the budget.
create or replace function pgque._chunk_bytes()
returns bigint language sql immutable
as $$ select 33554432::bigint $$;

-- _deliver(queue, subscription, max, where, span): the next unacknowledged
-- chunk of the subscription's open batch (opening one if needed; span is
-- _open_batch's catch-up bound), for a trusted predicate given as SQL text.
-- receive, receive_raw and receive_partitioned use _deliver_raw
-- (pgque.deliver_raw.sql), which hands out the same chunks at less cost;
-- this form is kept for callers that still pass a predicate. A chunk is at most max events and at most
-- _chunk_bytes() of data. One event past the chunk is looked at, so the
-- state records whether the chunk reaches the batch's end and ack needs no
-- second read. Tables: sub_state (insert when the delivered range changes).
drop function if exists pgque._deliver(text, text, integer, text);
create or replace function pgque._deliver(i_queue text, i_sub text, i_max integer, i_where text, i_span bigint)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    s       pgque.subscription;
    st      pgque.sub_state;
    v_batch bigint;
    v_where text;
    v_rows  pgque.message[];
    v_n     integer;
    v_total bigint;
    v_all   boolean;
    v_empty integer := 0;
begin
    if i_max is null then
        raise exception using errcode = '22004', message = 'max must not be NULL';
    end if;
    if i_max < 1 or i_max > 100000 then
        raise exception using errcode = 'PQ011', message = format('max must be between 1 and 100000, not %s', i_max);
    end if;
    -- The row alone (its state is read under the lock below); the full
    -- lookup only to raise the right error.
    select s1.* into s from pgque.subscription s1 join pgque.queue q on q.queue_id = s1.sub_queue
     where q.queue_name = i_queue and s1.sub_name = i_sub;
    if not found then
        s := pgque._subscription(i_queue, i_sub);
    end if;
    loop
        st := pgque._open_batch(s.sub_id, s.sub_queue, i_span);
        v_batch := st.st_batch;
        if v_batch is null then
            return;
        end if;
        v_where := pgque._and(i_where, st.st_acked_to);
        s.sub_last_tick := st.st_last_tick;
        s.sub_next_tick := st.st_next_tick;
        s.sub_batch := v_batch;
        -- The chunk in one statement. Payloads written by send are JSON; only
        -- insert_event can store other text, and then the chunk is read
        -- again with such data wrapped as a JSON string (one subtransaction
        -- per chunk, none per row).
        begin
            select array_agg(row(g.ev_id, v_batch, g.ev_type, g.ev_data::jsonb, coalesce(g.ev_retry, 0), g.ev_time,
                                 g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message order by g.ev_id),
                   max(g.total)
              into v_rows, v_total
              from (select g0.*, row_number() over w as rn, count(*) over () as total,
                           coalesce(sum(octet_length(g0.ev_data)) over w, 0) as run
                      from pgque._batch_rows(s, v_where, i_max + 1) g0
                    window w as (order by g0.ev_id rows unbounded preceding)) g
             where g.rn <= i_max and (g.rn = 1 or g.run <= pgque._chunk_bytes());
        exception when data_exception or program_limit_exceeded then
            select array_agg(row(g.ev_id, v_batch, g.ev_type, pgque._payload(g.ev_data), coalesce(g.ev_retry, 0), g.ev_time,
                                 g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message order by g.ev_id),
                   max(g.total)
              into v_rows, v_total
              from (select g0.*, row_number() over w as rn, count(*) over () as total,
                           coalesce(sum(octet_length(g0.ev_data)) over w, 0) as run
                      from pgque._batch_rows(s, v_where, i_max + 1) g0
                    window w as (order by g0.ev_id rows unbounded preceding)) g
             where g.rn <= i_max and (g.rn = 1 or g.run <= pgque._chunk_bytes());
        end;
        v_n := coalesce(cardinality(v_rows), 0);
        if v_n > 0 then
            v_all := v_n >= v_total;
            if st.st_delivered_to is distinct from (v_rows[v_n]).msg_id or st.st_delivered_all is distinct from v_all then
                st.st_delivered_to := (v_rows[v_n]).msg_id;
                st.st_delivered_all := v_all;
                perform pgque._put_state(st);
            end if;
            return query select * from unnest(v_rows);
            return;
        end if;
        -- Nothing (left) for this consumer in the batch: finish it, go on.
        perform pgque._finish(st);
        v_empty := v_empty + 1;
        if v_empty >= 100 then
            return;
        end if;
    end loop;
end;
$$;

-- _ack(batch_id, where): acknowledges the chunk the last delivery handed
-- out. Returns 1 when that finished the batch, 0 when rows remain (or
-- nothing had been handed out). Whether rows remain was recorded by the
-- delivery (it looked one event past the chunk), so the batch is never
-- finished past rows nobody received. i_where is unused (the delivery
-- applied it); it is kept for the callers' signature.
-- Tables: sub_state (insert), subscription (lock).
create or replace function pgque._ack(i_batch_id bigint, i_where text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    st := pgque._lock_sub((i_batch_id % 1048576)::integer);
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
