-- Chunked delivery of batches, shared by receive and the partition layer.
--
-- A batch is handed out in chunks of at most max rows in ev_id order. A
-- chunk is redelivered until it is acknowledged (at-least-once, no session
-- state). Acknowledging the chunk that reaches the batch's end finishes the
-- batch; the batch can never be finished past rows nobody received.
-- Batches that hold nothing for the consumer are finished at once, so its
-- cursor keeps moving. Both functions reach the engine only through
-- next_batch, get_batch_cursor and finish_batch; i_where is a trusted
-- predicate (NULL, or built by the partition layer from integers).

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

-- _payload(data): the event data as jsonb; data that is not JSON (written
-- by insert_event) is returned as a JSON string rather than failing the
-- whole chunk.
create or replace function pgque._payload(i_data text)
returns jsonb language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    return i_data::jsonb;
exception when invalid_text_representation then
    return to_jsonb(i_data);
end;
$$;

-- _deliver(queue, subscription, max, where): the next unacknowledged chunk
-- of the subscription's open batch (opening one if needed).
create or replace function pgque._deliver(i_queue text, i_sub text, i_max integer, i_where text)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    v_batch bigint;
    v_sub   integer;
    p       pgque.sub_progress;
    v_from  bigint;
    v_where text;
    v_rows  pgque.message[];
    v_n     integer;
    v_empty integer := 0;
    c       refcursor;
begin
    if i_max is null then
        raise exception using errcode = '22004', message = 'max must not be NULL';
    end if;
    if i_max < 1 or i_max > 100000 then
        raise exception using errcode = 'PQ011', message = format('max must be between 1 and 100000, not %s', i_max);
    end if;
    loop
        v_batch := pgque.next_batch(i_queue, i_sub);
        if v_batch is null then
            return;
        end if;
        v_sub := (v_batch % 1048576)::integer;
        select * into p from pgque.sub_progress where sub_id = v_sub;
        v_from := case when p.batch_id = v_batch then p.acked_to end;
        v_where := pgque._and(i_where, v_from);
        c := 'pgque_deliver_' || v_batch;
        -- The chunk in one statement. Payloads written by send are JSON; only
        -- insert_event can store other text, and then the chunk is read
        -- again with such data wrapped as a JSON string (one subtransaction
        -- per chunk, none per row).
        begin
            v_rows := array(
                select row(g.ev_id, v_batch, g.ev_type, g.ev_data::jsonb, coalesce(g.ev_retry, 0), g.ev_time,
                           g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message
                  from pgque.get_batch_cursor(v_batch, c::text, i_max, v_where) g);
        exception when invalid_text_representation then
            v_rows := array(
                select row(g.ev_id, v_batch, g.ev_type, pgque._payload(g.ev_data), coalesce(g.ev_retry, 0), g.ev_time,
                           g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message
                  from pgque.get_batch_cursor(v_batch, c::text, i_max, v_where) g);
        end;
        close c;
        v_n := cardinality(v_rows);
        if v_n > 0 then
            insert into pgque.sub_progress as sp (sub_id, batch_id, acked_to, delivered_to, delivered_all)
            values (v_sub, v_batch, v_from, (v_rows[v_n]).msg_id, v_n < i_max)
            on conflict (sub_id) do update
               set batch_id = excluded.batch_id, acked_to = excluded.acked_to,
                   delivered_to = excluded.delivered_to, delivered_all = excluded.delivered_all;
            return query select * from unnest(v_rows);
            return;
        end if;
        -- Nothing (left) for this consumer in the batch: finish it, go on.
        perform pgque.finish_batch(v_batch);
        v_empty := v_empty + 1;
        if v_empty >= 100 then
            return;
        end if;
    end loop;
end;
$$;

-- _ack(batch_id, where): acknowledges the chunk the last delivery handed
-- out. Returns 1 when that finished the batch, 0 when rows remain (or
-- nothing had been handed out).
create or replace function pgque._ack(i_batch_id bigint, i_where text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.subscription := pgque._batch(i_batch_id);
    p      pgque.sub_progress;
    v_more boolean;
    c      refcursor := 'pgque_ack_' || i_batch_id;
begin
    select * into p from pgque.sub_progress where sub_id = s.sub_id for update;
    if not found or p.batch_id <> i_batch_id or p.delivered_to is null then
        return 0;
    end if;
    if not p.delivered_all then
        select count(*) > 0 into v_more
          from pgque.get_batch_cursor(i_batch_id, c::text, 1, pgque._and(i_where, p.delivered_to));
        close c;
        if v_more then
            update pgque.sub_progress
               set acked_to = delivered_to, delivered_to = null, delivered_all = false
             where sub_id = s.sub_id;
            return 0;
        end if;
    end if;
    perform pgque.finish_batch(i_batch_id);
    return 1;
end;
$$;
