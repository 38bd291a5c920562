-- Internal helpers shared by the engine functions. None of them is granted
-- to any role: they run inside SECURITY DEFINER functions that already pin
-- search_path, and they only use schema-qualified names.

-- _record_version(version): records the installed schema version.
create or replace function pgque._record_version(i_version text)
returns void language sql
set search_path = pg_catalog, pg_temp
as $$
    insert into pgque.version (singleton, version, installed_at)
    values (true, i_version, pg_catalog.now())
    on conflict (singleton) do update set version = excluded.version, installed_at = excluded.installed_at;
$$;

-- The two encodings the engine packs into integers, named once. They are
-- SQL functions with a body parsed at creation (RETURN), IMMUTABLE and
-- without settings, so the planner inlines them: a call costs nothing, and
-- a constant argument folds, as the arithmetic written out would (plan-time
-- partition pruning sees the partitions' bounds).
--
-- Event partitions: event table n (0..15) of queue q holds ev_part
-- q*16 + n (see structure/tables.sql), so a queue's events are the
-- ev_part range [_part_lo(q), _part_hi(q)).
create or replace function pgque._part(i_queue_id integer, i_table integer)
returns integer language sql immutable parallel safe
return i_queue_id * 16 + i_table;

create or replace function pgque._part_lo(i_queue_id integer)
returns integer language sql immutable parallel safe
return i_queue_id * 16;

create or replace function pgque._part_hi(i_queue_id integer)
returns integer language sql immutable parallel safe
return i_queue_id * 16 + 16;

create or replace function pgque._part_queue(i_part integer)
returns integer language sql immutable parallel safe
return i_part / 16;

-- Batch ids: a batch id is a number from batch_id_seq times 2^20 plus the
-- subscription's id (sub_id < 2^20), so the id alone names its
-- subscription.
create or replace function pgque._batch_id(i_seq bigint, i_sub integer)
returns bigint language sql immutable parallel safe
return i_seq * 1048576 + i_sub;

create or replace function pgque._batch_sub(i_batch_id bigint)
returns integer language sql immutable parallel safe
return (i_batch_id % 1048576)::integer;

-- _next_ev_id(seq): the next ev_id from the queue's event sequence, taken
-- after the transaction has its id (pg_current_xact_id() assigns it): an
-- event's ev_id is then never below the sequence value a tick saw while
-- the event's transaction could still commit unseen (see _tick_due). Every
-- write of a new event takes its id here. Inlined like the encodings
-- above, so the invariant costs no call.
create or replace function pgque._next_ev_id(i_seq regclass)
returns bigint language sql volatile
return case when pg_current_xact_id() is not null then nextval(i_seq) end;

-- _not_null(what, value): raises 22004 naming the argument when value is NULL.
create or replace function pgque._not_null(i_what text, i_value anyelement)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_value is null then
        raise exception using errcode = '22004', message = format('%s must not be NULL', i_what);
    end if;
end;
$$;

-- _check_name(kind, name): validates a queue or consumer name: 1..63
-- bytes of letters, digits and '_', '.', ':', '#', '/', '-', not starting
-- with punctuation. Raises 22004 for NULL and PQ010 otherwise. (Layers
-- above may reserve some of these characters for names they generate.)
drop function if exists pgque._check_name(text, text, boolean);
create or replace function pgque._check_name(i_kind text, i_name text)
returns text language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_name is null then
        raise exception using errcode = '22004', message = format('%s name must not be NULL', i_kind);
    end if;
    if i_name = '' then
        raise exception using errcode = 'PQ010', message = format('%s name must not be empty', i_kind);
    end if;
    if octet_length(i_name) > 63 then
        raise exception using errcode = 'PQ010',
            message = format('%s name %s… is %s bytes long; the limit is 63', i_kind,
                             quote_literal(left(i_name, 40)), octet_length(i_name));
    end if;
    if i_name !~ '^[A-Za-z0-9_][A-Za-z0-9_.:#/-]*$' then
        raise exception using errcode = 'PQ010',
            message = format('invalid %s name %L: use letters, digits, "_", ".", ":" and "-", starting with a letter, digit or "_"', i_kind, i_name);
    end if;
    return i_name;
end;
$$;

-- _queue(name): the queue row, or PQ001 (22004 for NULL).
create or replace function pgque._queue(i_queue text)
returns pgque.queue language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue;
begin
    select * into q from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    return q;
end;
$$;

-- _raise_no_queue(name): raises 22004 for NULL, PQ001 otherwise.
create or replace function pgque._raise_no_queue(i_queue text)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_queue is null then
        raise exception using errcode = '22004', message = 'queue name must not be NULL';
    end if;
    raise exception using errcode = 'PQ001', message = format('queue %L does not exist', i_queue);
end;
$$;

-- _subscription(queue, consumer): the subscription row with its current
-- state (cursor, open batch: see _with_state), or PQ001/PQ002.
create or replace function pgque._subscription(i_queue text, i_consumer text)
returns pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription;
begin
    select s1.* into s
      from pgque.subscription s1 join pgque.queue q on q.queue_id = s1.sub_queue
     where q.queue_name = i_queue and s1.sub_name = i_consumer;
    if not found then
        perform pgque._queue(i_queue);
        perform pgque._not_null('consumer name', i_consumer);
        raise exception using errcode = 'PQ002',
            message = format('consumer %L is not subscribed to queue %L', i_consumer, i_queue);
    end if;
    return pgque._with_state(s);
end;
$$;

-- _event_table(queue_id, n): the name of a queue's n-th event table. No
-- SET clause, every name qualified instead: a SET keeps a SQL function
-- from being inlined, and each call then planned its body again (a keyed
-- send that found its key in a table paid for that on every call).
create or replace function pgque._event_table(i_queue_id integer, i_n integer)
returns text language sql immutable
as $$ select 'pgque.' operator(pg_catalog.||) pg_catalog.quote_ident('event_' operator(pg_catalog.||)
          i_queue_id::pg_catalog.text operator(pg_catalog.||) '_' operator(pg_catalog.||) i_n::pg_catalog.text) $$;

-- _deliverable_bytes(): the longest jsonb string, 268435455 bytes (see
-- _check_deliverable). Inlined.
create or replace function pgque._deliverable_bytes()
returns bigint language sql immutable
as $$ select 268435455::bigint $$;

-- _fields_bytes(type, extra1..4): the bytes of an event's text beside its
-- data (NULLs count 0). Inlined.
create or replace function pgque._fields_bytes(i_type text, i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns bigint language sql immutable
return coalesce(octet_length(i_type), 0)::bigint + coalesce(octet_length(i_extra1), 0) + coalesce(octet_length(i_extra2), 0)
       + coalesce(octet_length(i_extra3), 0) + coalesce(octet_length(i_extra4), 0);

-- _check_fields(what, names, type, extra1..4): refuses (54000) an event
-- whose type and extra fields hold more than _deliverable_bytes()
-- together. The consumers' receives hand a chunk out as one array of
-- messages, and a single event goes alone however large: beside its
-- payload (at most that many bytes as jsonb) its other fields must leave
-- the message under PostgreSQL's 1 GB per value, or every receive of its
-- batch failed for good and the events behind it waited forever; past
-- 1 GB together the insert itself failed with an internal error (XX000).
-- The writers call it only when _fields_bytes is over the limit (one sum
-- on their path). what names the event ('' alone, 'event 3 of the batch: '
-- in a batch), names its fields as the caller's contract calls them.
create or replace function pgque._check_fields(i_what text, i_names text, i_type text, i_extra1 text, i_extra2 text,
                                               i_extra3 text, i_extra4 text)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if pgque._fields_bytes(i_type, i_extra1, i_extra2, i_extra3, i_extra4) > pgque._deliverable_bytes() then
        raise exception using errcode = '54000',
            message = format('%s%s of %s bytes together cannot be delivered: at most %s bytes (the type is %s bytes)',
                             i_what, i_names, pgque._fields_bytes(i_type, i_extra1, i_extra2, i_extra3, i_extra4),
                             pgque._deliverable_bytes(), coalesce(octet_length(i_type), 0));
    end if;
end;
$$;

-- _check_deliverable(data): refuses (54000) event data that receive and
-- receive_partitioned could never hand out, before it is stored. They
-- deliver data as jsonb, and data jsonb cannot hold as a JSON string of
-- its text (_payload), but a jsonb string holds at most 268435455 bytes:
-- data longer than that which is not JSON jsonb can hold made every
-- receive of its batch fail, so one send stopped the queue's consumers
-- for good. The writers call it only for data over that length (one
-- length test on their path); such data passes when jsonb holds it.
create or replace function pgque._check_deliverable(i_data text)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    perform i_data::jsonb;
exception when data_exception or program_limit_exceeded then
    raise exception using errcode = '54000',
        message = format('event data of %s bytes cannot be delivered: data over %s bytes must be JSON that jsonb can hold',
                         octet_length(i_data), pgque._deliverable_bytes());
end;
$$;
