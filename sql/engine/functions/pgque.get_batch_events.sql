-- Reading a batch.
--
-- The events of a batch are those whose ev_txid is visible in the batch's
-- tick snapshot and not visible in the previous tick's snapshot: exactly
-- the transactions that committed between the two ticks, however long they
-- ran and whichever event table they wrote to. "Not visible in the previous
-- snapshot" is spelled as an index-friendly condition: the txid is at or
-- past the previous snapshot's xmax, or in its list of in-progress txids.
-- All of the queue's event tables are searched (an index probe each), so a
-- long transaction that wrote to a table since rotated out of "current" is
-- still found. Retried events carry ev_owner and are seen only by their
-- subscription.

-- _batch_query(extra_where): the batch query text. Parameters: $1, $2 the
-- queue's ev_part range, $3 previous xmax, $4 batch xmax, $5 previous
-- in-progress txids, $6 batch snapshot, $7 sub_id, $8 one ev_id or NULL.
-- extra_where is a trusted predicate (see get_batch_cursor).
create or replace function pgque._batch_query(i_extra_where text)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$
select 'select ev_id, ev_time, ev_txid::text::bigint, ev_retry, ev_type, ev_data,'
    || ' ev_extra1, ev_extra2, ev_extra3, ev_extra4'
    || ' from pgque.event'
    || ' where ev_part >= $1 and ev_part < $2'
    || ' and ((ev_txid >= $3 and ev_txid < $4) or ev_txid = any($5))'
    || ' and pg_catalog.pg_visible_in_snapshot(ev_txid, $6)'
    || ' and (ev_owner is null or ev_owner = $7)'
    || ' and ($8::bigint is null or ev_id = $8)'
    || coalesce(' and (' || i_extra_where || ')', '')
    || ' order by ev_id'
$$;

-- _batch_bounds(sub): the parameters $1..$7 of _batch_query for the open
-- batch of a subscription.
create or replace function pgque._batch_bounds(
    s pgque.subscription,
    out o_part_lo integer, out o_part_hi integer,
    out o_prev_xmax xid8, out o_cur_xmax xid8, out o_prev_xip xid8[],
    out o_cur_snap pg_snapshot)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_prev pg_snapshot;
begin
    select tick_snapshot into v_prev from pgque.tick
     where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    select tick_snapshot into o_cur_snap from pgque.tick
     where tick_queue = s.sub_queue and tick_id = s.sub_next_tick;
    if v_prev is null or o_cur_snap is null then
        raise exception using errcode = 'XX000',
            message = format('ticks %s/%s of batch %s are missing', s.sub_last_tick, s.sub_next_tick, s.sub_batch);
    end if;
    o_part_lo := pgque._part_lo(s.sub_queue);
    o_part_hi := pgque._part_hi(s.sub_queue);
    o_prev_xmax := pg_snapshot_xmax(v_prev);
    o_cur_xmax := pg_snapshot_xmax(o_cur_snap);
    -- With 0 (no transaction's id) so that the list is never empty: see
    -- v_xip in sql/templates/deliver_raw.sql.tmpl.
    o_prev_xip := array(select pg_snapshot_xip(v_prev)) || '0'::xid8;
end;
$$;

-- _batch_event(sub, ev_id): the one event ev_id of the subscription's open
-- batch, as get_batch_events returns it; PQ022 when it is not in the batch.
-- Used by event_retry and event_defer.
create or replace function pgque._batch_event(s pgque.subscription, i_ev_id bigint)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    b record := pgque._batch_bounds(s);
begin
    return query execute pgque._batch_query(null)
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, i_ev_id;
    if not found then
        raise exception using errcode = 'PQ022', message = format('event %s is not in batch %s', i_ev_id, s.sub_batch);
    end if;
end;
$$;

-- _batch_rows(sub, where, limit): the first `limit` events of the
-- subscription's open batch (s carries its current state) matching the
-- trusted predicate i_where, in ev_id order: get_batch_cursor without the
-- batch lookup and the cursor, for callers that already hold the state.
create or replace function pgque._batch_rows(s pgque.subscription, i_where text, i_limit integer)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    b record := pgque._batch_bounds(s);
begin
    return query execute pgque._batch_query(i_where) || ' limit ' || i_limit::text
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, null::bigint;
end;
$$;

-- get_batch_events(batch_id): the batch's events in ev_id order.
create or replace function pgque.get_batch_events(i_batch_id bigint)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._batch(i_batch_id);
    b record;
begin
    b := pgque._batch_bounds(s);
    return query execute pgque._batch_query(null)
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, null::bigint;
end;
$$;

-- _batch_cursor(batch_id, cursor_name, fetch, where): opens cursor
-- cursor_name over the batch's events, filtered by the trusted predicate
-- i_where, and returns its first `fetch` rows; the cursor stays open in the
-- transaction for further FETCH. i_where is pasted into the query as SQL,
-- so this is granted to nobody: the partition layer calls it with
-- predicates built from validated integers alone.
create or replace function pgque._batch_cursor(
    i_batch_id bigint, i_cursor_name text, i_fetch integer, i_where text)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    s   pgque.subscription := pgque._batch(i_batch_id);
    b   record;
    c   refcursor := i_cursor_name;
begin
    if i_cursor_name is null or i_fetch is null then
        raise exception using errcode = '22004', message = 'cursor name and fetch count must not be NULL';
    end if;
    if i_fetch < 0 then
        raise exception using errcode = 'PQ011', message = format('fetch count must not be negative, not %s', i_fetch);
    end if;
    b := pgque._batch_bounds(s);
    open c no scroll for execute pgque._batch_query(nullif(i_where, ''))
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, null::bigint;
    -- One FETCH for the whole first part, not a PL/pgSQL loop per row
    -- (FETCH FORWARD 0 would mean "the current row": skip it).
    if i_fetch > 0 then
        return query execute format('fetch forward %s from %I', i_fetch, i_cursor_name);
    end if;
end;
$$;

-- get_batch_cursor(batch_id, cursor_name, fetch, extra_where): PgQ's
-- cursor over a batch (see _batch_cursor). extra_where is SQL that runs
-- with pgque's owner's rights, so only a login that is the owner (or a
-- member of its role, as a superuser is) may pass one: a pgque_admin that
-- is not could call a function of its own from it and run that as the
-- owner. Anyone else gets 42501 and filters the returned rows instead.
-- Executable by the owner and pgque_admin.
create or replace function pgque.get_batch_cursor(
    i_batch_id bigint, i_cursor_name text, i_fetch integer, i_extra_where text)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if nullif(i_extra_where, '') is not null
       and not pg_has_role(session_user, (select nspowner from pg_namespace where nspname = 'pgque'), 'MEMBER') then
        raise exception using errcode = '42501',
            message = 'extra_where runs as pgque''s owner: only the owner may pass one',
            hint = 'Pass NULL and filter the rows it returns.';
    end if;
    return query select * from pgque._batch_cursor(i_batch_id, i_cursor_name, i_fetch, i_extra_where);
end;
$$;
