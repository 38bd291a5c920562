-- Producing.
--
-- send stores the JSON payload as the event's data and the partition key
-- in ev_extra1. send_batch inserts a whole array with one set-based INSERT.

-- send(queue, type, payload, partition_key[, dedup_key]): returns the
-- ev_id. The parameters carry the documented names so that callers can
-- write partition_key => 'tenant-42', dedup_key => 'req-7'; the body uses
-- i_ aliases. With a dedup key, a send of a key already sent to this queue
-- within its dedup_window returns the first event's ev_id and stores
-- nothing (pgque.dedup.sql); without one the feature costs one test here
-- and the key index's predicate test on the insert.
drop function if exists pgque.send(text, text, jsonb, text);
create or replace function pgque.send(queue text, type text, payload jsonb, partition_key text,
                                      dedup_key text default null)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue         alias for $1;
    i_type          alias for $2;
    i_payload       alias for $3;
    i_partition_key alias for $4;
    i_dedup_key     alias for $5;
    v_part          integer;
    v_seq           regclass;
    v_id            bigint;
    v_confined      boolean;
    v_switch        timestamptz;
    v_retired       timestamptz[];
    v_expire        timestamptz;
begin
    if i_payload is null or i_type is null
       or pgque._fields_bytes(i_type, i_partition_key, null, null, null) > pgque._deliverable_bytes() then
        if i_payload is null or i_type is null then
            raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
        end if;
        perform pgque._check_fields('', 'event type and partition key', i_type, i_partition_key, null, null, null);
    end if;
    if i_dedup_key is null then
        -- What _insert_event does, inlined: one PL/pgSQL call less on the
        -- hot path is about a fifth of its server time.
        select pgque._part(queue_id, queue_cur_table), queue_event_seq, 'produce' = any (queue_confined)
          into v_part, v_seq, v_confined
          from pgque.queue where queue_name = i_queue;
        if not found then
            perform pgque._raise_no_queue(i_queue);
        end if;
        if v_confined then
            perform pgque._authorize_id(pgque._part_queue(v_part), 'produce'); -- access check
        end if;
        v_id := pgque._next_ev_id(v_seq);
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
        values (v_id, v_part, i_type, i_payload::text, i_partition_key);
        return v_id;
    end if;
    if i_dedup_key = '' or octet_length(i_dedup_key) > 512 then
        perform pgque._dedup_check_keys(array[i_dedup_key]);
    end if;
    -- _dedup_send's common case inline (a fresh key, no rotation within
    -- the window, an open queue: one INSERT, whose unique index is both
    -- the lookup and what makes a concurrent sender of the key wait, see
    -- pgque.dedup.sql); anything else, and a key the index refuses, goes
    -- to _dedup_send. Inlined: the PL/pgSQL call was a quarter of what a
    -- key costs a send.
    select pgque._part(queue_id, queue_cur_table), queue_event_seq, 'produce' = any (queue_confined), queue_switch_time,
           queue_retired, clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
      into v_part, v_seq, v_confined, v_switch, v_retired, v_expire
      from pgque.queue where queue_name = i_queue;
    if found and not v_confined and (v_retired is null or v_switch <= v_expire) then
        v_id := pgque._next_ev_id(v_seq);
        begin
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
            values (v_id, v_part, i_type, i_payload::text, i_partition_key, i_dedup_key);
            return v_id;
        exception when unique_violation then
            -- sent before: _dedup_send finds it
            return pgque._dedup_send(i_queue, i_type, i_payload::text, i_partition_key, i_dedup_key, 'on conflict');
        end;
    end if;
    return pgque._dedup_send(i_queue, i_type, i_payload::text, i_partition_key, i_dedup_key, 'catch');
end;
$$;

-- _jsonb_may_refuse(json): whether JSON text that json_in accepts may
-- hold an escape jsonb refuses, which the text forms of send then find
-- out with a jsonb parse (jsonb's own error, 22P05 or 22P02): "\u0000",
-- and an escape of a lone UTF-16 surrogate ("\uD83D" not followed by a
-- low one), which a producer that cut a string between the two halves of
-- a pair writes. A consumer reading jsonb (receive, the views) would
-- otherwise get such an event's payload as a JSON string. One strpos, no
-- parse, on the common path (1.3 % of a small text send's instructions,
-- scripts/send-instructions; a test of the surrogate ranges alone cost
-- 4 %, a regular expression for numbers past numeric's range 8 %); every
-- payload with a \u escape pays the parse. Such a number (1e1000000,
-- which json_in takes and jsonb does not) is not looked for: it still
-- reaches jsonb readers as a string (docs/sql-reference.md). An SQL body,
-- inlined into the caller's expression.
create or replace function pgque._jsonb_may_refuse(i_json text)
returns boolean language sql immutable
return pg_catalog.strpos(i_json, '\u') operator(pg_catalog.>) 0;

-- send(queue, type, payload text, partition_key[, dedup_key]): send for
-- a payload the caller already holds as JSON text (the Go client, psql
-- literals): the same contract and result, without building a jsonb value
-- on the way in and printing it back on the way to the event table. The
-- text is checked with json_in (syntax only, nothing built) and stored as
-- given, whitespace and key order included; consumers read the same jsonb
-- as from the jsonb form. An escape jsonb refuses (\u0000, a lone
-- surrogate) is refused here with jsonb's error by a jsonb parse that only
-- payloads _jsonb_may_refuse names pay.
create or replace function pgque.send(queue text, type text, payload text, partition_key text,
                                      dedup_key text default null)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue         alias for $1;
    i_type          alias for $2;
    i_payload       alias for $3;
    i_partition_key alias for $4;
    i_dedup_key     alias for $5;
    v_part          integer;
    v_seq           regclass;
    v_id            bigint;
    v_confined      boolean;
    v_switch        timestamptz;
    v_retired       timestamptz[];
    v_expire        timestamptz;
begin
    -- One test on the common path: NULLs and what jsonb may refuse take
    -- the branch, other valid JSON does not.
    if i_type is null or i_payload::json is null or pgque._jsonb_may_refuse(i_payload)
       or octet_length(i_payload) > pgque._deliverable_bytes()
       or pgque._fields_bytes(i_type, i_partition_key, null, null, null) > pgque._deliverable_bytes() then
        if i_payload is null or i_type is null then
            raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
        end if;
        perform pgque._check_fields('', 'event type and partition key', i_type, i_partition_key, null, null, null);
        if octet_length(i_payload) > pgque._deliverable_bytes() then
            perform pgque._check_deliverable(i_payload);
        end if;
        perform i_payload::jsonb;
    end if;
    if i_dedup_key is null then
        -- Inlined _insert_event, as in the jsonb form.
        select pgque._part(queue_id, queue_cur_table), queue_event_seq, 'produce' = any (queue_confined)
          into v_part, v_seq, v_confined
          from pgque.queue where queue_name = i_queue;
        if not found then
            perform pgque._raise_no_queue(i_queue);
        end if;
        if v_confined then
            perform pgque._authorize_id(pgque._part_queue(v_part), 'produce'); -- access check
        end if;
        v_id := pgque._next_ev_id(v_seq);
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
        values (v_id, v_part, i_type, i_payload, i_partition_key);
        return v_id;
    end if;
    if i_dedup_key = '' or octet_length(i_dedup_key) > 512 then
        perform pgque._dedup_check_keys(array[i_dedup_key]);
    end if;
    -- The common case inline, as in the jsonb form.
    select pgque._part(queue_id, queue_cur_table), queue_event_seq, 'produce' = any (queue_confined), queue_switch_time,
           queue_retired, clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
      into v_part, v_seq, v_confined, v_switch, v_retired, v_expire
      from pgque.queue where queue_name = i_queue;
    if found and not v_confined and (v_retired is null or v_switch <= v_expire) then
        v_id := pgque._next_ev_id(v_seq);
        begin
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
            values (v_id, v_part, i_type, i_payload, i_partition_key, i_dedup_key);
            return v_id;
        exception when unique_violation then
            return pgque._dedup_send(i_queue, i_type, i_payload, i_partition_key, i_dedup_key, 'on conflict');
        end;
    end if;
    return pgque._dedup_send(i_queue, i_type, i_payload, i_partition_key, i_dedup_key, 'catch');
end;
$$;

create or replace function pgque.send(i_queue text, i_type text, i_payload jsonb)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_payload is null or i_type is null then
        raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
    end if;
    return pgque._insert_event(i_queue, i_type, i_payload::text, null, null, null, null);
end;
$$;

create or replace function pgque.send(i_queue text, i_payload jsonb)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_payload is null then
        raise exception using errcode = '22004', message = 'payload must not be NULL';
    end if;
    return pgque._insert_event(i_queue, 'default', i_payload::text, null, null, null, null);
end;
$$;

-- _send_batch(queue, type, types, payloads, partition_keys, dedup_keys,
-- check): the body of every send_batch form, over payloads as text. Either
-- type is the one type of all the payloads (the single-type forms; types
-- is NULL) or types holds the type of each payload (the mixed forms; type
-- is NULL). check says whether the payloads still need their JSON checked
-- (the text forms) or came as jsonb (the jsonb forms, whose caller parsed
-- them). One INSERT for the whole array; types, partition_keys and
-- dedup_keys are each NULL or as long as payloads. ev_ids are taken in
-- array order, so they are returned in input order. With dedup_keys,
-- elements are sent one by one, in key order: an element whose key was
-- sent within the window (by an earlier element of the same batch too)
-- gets that event's ev_id, and a NULL element key means no dedup for that
-- element.
-- Not granted: the send_batch entry points call it after their access
-- check, and it runs under their pinned search_path (no SET clause of its
-- own: see _dedup_send). Tables: reads queue; inserts into event (and
-- dedup_0/1).
drop function if exists pgque._send_batch(text, text, text[], text[], text[], boolean);
create or replace function pgque._send_batch(i_queue text, i_type text, i_types text[], i_payloads text[],
                                             i_partition_keys text[], i_dedup_keys text[], i_check boolean)
returns bigint[] language plpgsql
as $$
declare
    v_i      integer;
    v_part   integer;
    v_seq    regclass;
    v_ids    bigint[];
    v_out    bigint[];
    v_xid    xid8;
    v_qid    integer;
    v_cur    integer;
    v_ntab   integer;
    v_switch timestamptz;
    v_retired timestamptz[];
    v_expire timestamptz;
    v_waited timestamptz;
begin
    if (i_type is null and i_types is null) or i_payloads is null then
        raise exception using errcode = '22004', message = 'event type and payloads must not be NULL';
    end if;
    if array_ndims(i_payloads) > 1 or array_ndims(i_partition_keys) > 1 or array_ndims(i_dedup_keys) > 1
       or array_ndims(i_types) > 1 then
        raise exception using errcode = 'PQ011', message = 'types, payloads and keys must be one-dimensional arrays';
    end if;
    if i_types is not null then
        if coalesce(cardinality(i_types), 0) <> coalesce(cardinality(i_payloads), 0) then
            raise exception using errcode = 'PQ011',
                message = format('%s types for %s payloads; pass one type per payload',
                                 cardinality(i_types), cardinality(i_payloads));
        end if;
        if array_position(i_types, null) is not null then
            raise exception using errcode = '22004',
                message = format('type %s of the batch is NULL', array_position(i_types, null));
        end if;
    end if;
    if i_partition_keys is not null
       and coalesce(cardinality(i_partition_keys), 0) <> coalesce(cardinality(i_payloads), 0) then
        raise exception using errcode = 'PQ011',
            message = format('%s partition keys for %s payloads; pass one key per payload, or NULL',
                             cardinality(i_partition_keys), cardinality(i_payloads));
    end if;
    if i_dedup_keys is not null
       and coalesce(cardinality(i_dedup_keys), 0) <> coalesce(cardinality(i_payloads), 0) then
        raise exception using errcode = 'PQ011',
            message = format('%s dedup keys for %s payloads; pass one key (or NULL) per payload, or NULL',
                             cardinality(i_dedup_keys), cardinality(i_payloads));
    end if;
    if array_position(i_payloads, null) is not null then
        raise exception using errcode = '22004',
            message = format('payload %s of the batch is NULL', array_position(i_payloads, null));
    end if;
    -- Types and keys a message could not carry (_check_fields).
    if pgque._fields_bytes(i_type, null, null, null, null) > pgque._deliverable_bytes() then
        perform pgque._check_fields('', 'event type', i_type, null, null, null, null);
    end if;
    perform pgque._check_fields(format('event %s of the batch: ', u.ord), 'event type and partition key', coalesce(u.typ, i_type), u.pkey, null, null, null)
       from unnest(i_partition_keys, i_types) with ordinality as u(pkey, typ, ord)
      where pgque._fields_bytes(coalesce(u.typ, i_type), u.pkey, null, null, null) > pgque._deliverable_bytes();
    select pgque._part(queue_id, queue_cur_table), queue_event_seq into v_part, v_seq
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if coalesce(cardinality(i_payloads), 0) = 0 then
        return '{}';
    end if;

    -- The text form's JSON check (see send): json_in for every payload,
    -- jsonb's for one _jsonb_may_refuse names, all before any ev_id is taken, so that
    -- a refused batch leaves the queue's sequence (which counts unticked
    -- events) where it was.
    if i_check then
        perform count(case when pgque._jsonb_may_refuse(p) then p::jsonb::text else p::json::text end)
           from unnest(i_payloads) as p;
        perform pgque._check_deliverable(p) from unnest(i_payloads) as p where octet_length(p) > pgque._deliverable_bytes();
    end if;

    if i_dedup_keys is not null then
        perform pgque._dedup_check_keys(i_dedup_keys);
        -- The ev_ids in input order first, as below; then the elements in
        -- key order, so that two batches sharing keys wait for each other
        -- on the key index in one order and cannot deadlock. A key sent
        -- before leaves its element's id unused. Within the window after a
        -- rotation the tables retired since are waited on once for every
        -- key (_dedup_wait), not once per element.
        v_xid := pg_current_xact_id();
        v_ids := array(select nextval(v_seq) from generate_series(1, cardinality(i_payloads)));
        v_out := v_ids;
        select queue_id, queue_cur_table, queue_ntables, queue_switch_time, queue_retired,
               clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
          into v_qid, v_cur, v_ntab, v_switch, v_retired, v_expire
          from pgque.queue where queue_name = i_queue;
        if v_switch > v_expire and v_retired is not null then
            perform pgque._dedup_wait(v_qid, v_cur, v_ntab, v_retired, v_expire, i_dedup_keys);
            v_waited := v_switch;
        end if;
        for v_i in select u.ord from unnest(i_dedup_keys) with ordinality u(k, ord) order by u.k nulls first, u.ord loop
            if i_dedup_keys[v_i] is null then
                insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
                values (v_ids[v_i], v_part, coalesce(i_types[v_i], i_type), i_payloads[v_i], i_partition_keys[v_i]);
            else
                v_out[v_i] := pgque._dedup_send(i_queue, coalesce(i_types[v_i], i_type), i_payloads[v_i], i_partition_keys[v_i],
                                                i_dedup_keys[v_i], 'on conflict', v_ids[v_i], v_waited);
            end if;
        end loop;
        return v_out;
    end if;

    -- The ev_ids are taken first, in input order, and the INSERT pairs
    -- them with the payloads: no RETURNING, no sort to put them back in
    -- order. The transaction's id is taken before them (see _tick_due).
    -- A NULL types array unnests as NULLs beside the payloads, so the one
    -- INSERT serves both forms.
    v_xid := pg_current_xact_id();
    v_ids := array(select nextval(v_seq) from generate_series(1, cardinality(i_payloads)));
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
    select u.id, v_part, coalesce(u.typ, i_type), u.payload, u.pkey
      from unnest(v_ids, i_payloads, i_partition_keys, i_types) as u(id, payload, pkey, typ);
    return v_ids;
end;
$$;

-- send_batch(queue, type, payloads jsonb[], partition_keys, dedup_keys):
-- sends payloads as one set-based INSERT (see _send_batch); parameters
-- named as documented, aliased i_ in the body. Returns the ev_ids in input
-- order.
drop function if exists pgque.send_batch(text, text, jsonb[], text[]);
create or replace function pgque.send_batch(queue text, type text, payloads jsonb[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_type           alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, i_type, null, i_payloads::text[], i_partition_keys, i_dedup_keys, false);
end;
$$;

-- send_batch(queue, type, payloads text[], partition_keys, dedup_keys): the
-- same for payloads held as JSON text (the Go client): each is checked as
-- the text form of send checks it and stored as given, with no jsonb value
-- built and printed back. Returns the ev_ids in input order. An untyped
-- NULL or array literal for payloads matches both forms: cast it.
create or replace function pgque.send_batch(queue text, type text, payloads text[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_type           alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, i_type, null, i_payloads, i_partition_keys, i_dedup_keys, true);
end;
$$;

-- send_batch(queue, types text[], payloads jsonb[], partition_keys,
-- dedup_keys): a batch of events of several types, in one statement and
-- in input order: types[i] is the type of payloads[i] (the two arrays as
-- long as each other, no NULL type). Otherwise as the single-type form,
-- and as fast (the same _send_batch and the same one INSERT). A call whose
-- second argument is an untyped literal ('T') or text resolves to the
-- single-type form: PostgreSQL prefers the string category for an unknown
-- argument. Returns the ev_ids in input order.
create or replace function pgque.send_batch(queue text, types text[], payloads jsonb[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_types          alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, null, i_types, i_payloads::text[], i_partition_keys, i_dedup_keys, false);
end;
$$;

-- send_batch(queue, types text[], payloads text[], partition_keys,
-- dedup_keys): the mixed-type form for payloads held as JSON text,
-- checked and stored as the single-type text form does. Returns the
-- ev_ids in input order.
create or replace function pgque.send_batch(queue text, types text[], payloads text[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_types          alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, null, i_types, i_payloads, i_partition_keys, i_dedup_keys, true);
end;
$$;
