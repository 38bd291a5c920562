-- Producing.
--
-- send stores the JSON payload as the event's data and the partition key
-- in ev_extra1. send_batch inserts a whole array with one set-based INSERT.

-- send(queue, type, payload, partition_key): returns the ev_id. The
-- parameters carry the documented names so that callers can write
-- partition_key => 'tenant-42'; the body uses i_ aliases.
-- Dropped only while it still has the old parameter names (a rename needs
-- a drop): an upgrade must not drop it every time, which would lose the
-- grants made on it.
do $drop$ begin
    if exists (select 1 from pg_catalog.pg_proc
                where oid operator(pg_catalog.=) pg_catalog.to_regprocedure('pgque.send(text, text, jsonb, text)')
                  and proargnames is distinct from array['queue', 'type', 'payload', 'partition_key']) then
        drop function pgque.send(text, text, jsonb, text);
    end if;
end $drop$;
create or replace function pgque.send(queue text, type text, payload jsonb, partition_key text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue         alias for $1;
    i_type          alias for $2;
    i_payload       alias for $3;
    i_partition_key alias for $4;
begin
    if i_payload is null or i_type is null then
        raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
    end if;
    return pgque._insert_event(i_queue, i_type, i_payload::text, i_partition_key, null, null, null);
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

-- send_batch(queue, type, payloads, partition_keys): one INSERT for the
-- whole array (parameters named as documented, aliased i_ in the body).
-- partition_keys is NULL or as long as payloads. ev_ids are
-- taken in array order, so they are returned in input order.
do $drop$ begin
    if exists (select 1 from pg_catalog.pg_proc
                where oid operator(pg_catalog.=) pg_catalog.to_regprocedure('pgque.send_batch(text, text, jsonb[], text[])')
                  and proargnames is distinct from array['queue', 'type', 'payloads', 'partition_keys']) then
        drop function pgque.send_batch(text, text, jsonb[], text[]);
    end if;
end $drop$;
create or replace function pgque.send_batch(queue text, type text, payloads jsonb[],
                                            partition_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_type           alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    v_part integer;
    v_seq  regclass;
    v_ids  bigint[];
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    if i_type is null or i_payloads is null then
        raise exception using errcode = '22004', message = 'event type and payloads must not be NULL';
    end if;
    if array_ndims(i_payloads) > 1 or array_ndims(i_partition_keys) > 1 then
        raise exception using errcode = 'PQ011', message = 'payloads and partition keys must be one-dimensional arrays';
    end if;
    if i_partition_keys is not null
       and coalesce(cardinality(i_partition_keys), 0) <> coalesce(cardinality(i_payloads), 0) then
        raise exception using errcode = 'PQ011',
            message = format('%s partition keys for %s payloads; pass one key per payload, or NULL',
                             cardinality(i_partition_keys), cardinality(i_payloads));
    end if;
    if array_position(i_payloads, null) is not null then
        raise exception using errcode = '22004',
            message = format('payload %s of the batch is NULL', array_position(i_payloads, null));
    end if;
    select queue_id * 16 + queue_cur_table, queue_event_seq into v_part, v_seq
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if coalesce(cardinality(i_payloads), 0) = 0 then
        return '{}';
    end if;

    with ids as materialized (
        select u.ord, nextval(v_seq) as id, u.payload, u.pkey
          from unnest(i_payloads, i_partition_keys) with ordinality as u(payload, pkey, ord)
    ), ins as (
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
        select ids.id, v_part, i_type, ids.payload::text, ids.pkey from ids
    )
    select array_agg(ids.id order by ids.ord) into v_ids from ids;
    return v_ids;
end;
$$;
