-- The read path: chunked delivery with the payload as stored (text).
--
-- _deliver_raw is what receive, receive_raw and receive_partitioned run. It
-- hands out a batch in chunks of at most max rows and _chunk_bytes() of
-- data, types and keys, redelivered until acknowledged, the state recording whether a
-- chunk reached the batch's end, at a low cost per chunk: the batch is read
-- by one static statement (the slot predicate takes the slot and the slot
-- count as parameters), which cuts and returns the chunk in one pass;
-- every state change of the call is made in memory and appended as one
-- record; and the payload is handed out as the stored text, so nothing
-- parses it. Callers that promise jsonb cast it themselves. A chunk of a
-- batch far larger than a chunk is read from a window of ev_ids past the
-- acknowledged ones, so draining a batch costs in proportion to its size.
-- See "The read path" and "Large batches" in docs/design.md.
--
-- _deliver_raw, receive_raw and the readers' statement (_reader_src) are
-- in pgque.deliver_raw.gen.sql, generated from
-- sql/templates/deliver_raw.sql.tmpl with receive_partitioned_raw (one
-- body in each entry point: see there why). This file holds what is
-- written by hand around them: the readers and _as_messages.

-- The body's earlier source, from when the install assembled the entry
-- points from it.
drop function if exists pgque._deliver_raw_body();

-- Readers. The statement that reads a chunk names the queue's partitions
-- by a parameter (the queue id) and the routing expression by another (the
-- slot count), so a plan made for one call serves no other: a generic plan
-- would hold every queue's partitions and could use no routing index. The
-- entry points therefore plan it at every chunk, and for a chunk of a few
-- events that planning was most of the call (0.4 ms of about 0.8 ms per
-- receive_partitioned_raw). A reader, pgque._read_<queue id>_<N>, is the
-- same statement with the queue id and N written in as numbers: plan-time
-- pruning keeps its partitions to the queue's own, N matches the routing
-- index, and its plan is made once per session (a generic plan, forced:
-- the custom plans would look cheaper, since they drop the running-xid
-- scan when no transaction ran, and cost a planning each). It plans
-- without sequential scans: a plan cached while a table is empty would
-- otherwise keep scanning it whole as it fills. The entry points call it
-- with EXECUTE, which plans only the call, and only for chunks of up to
-- 256 events (above, the rows cost more to hand over from a second
-- function than the plan costs). _make_reader makes one when a queue gets
-- its first consumer of that N (subscribe, subscribe_slot, resize_slots)
-- and the install remakes every existing one, so that a reader is always
-- the statement of the installed version; until one exists the entry
-- points read inline. A subscribe that would wait for another session's
-- open transaction making the same reader leaves it: maint()
-- (_maint_readers) makes a queue's missing reader for plain consumers,
-- maint_route_indexes those of the slot counts in use. Readers are not
-- granted to any role.

-- _make_function(name, signature, body, replace): creates the function
-- pgque.<name>, revoked from PUBLIC, or replaces it when replace is true.
-- signature is what comes between the name and the body (parameters,
-- result, language, settings), body its source. For the readers below and
-- the partition layer's key readers (pgque.tick_slots.sql) alone, whose
-- callers build every argument from constants of the install and
-- integers. Two sessions making the same function at once: the second
-- finds it made, or, while the first's transaction is open, waits for it
-- at most 50 ms and leaves it to maintenance (a consumer role may leave
-- its subscribe's transaction open as long as it likes, and another's
-- subscribe must not wait for it). These are the function bodies the
-- install (and subscribe) still builds from text: a reader exists to have
-- its queue id (and N) written in as numbers, which plan-time pruning and
-- the routing index need.
create or replace function pgque._make_function(i_name text, i_signature text, i_body text, i_replace boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_old_lt text := current_setting('lock_timeout');
begin
    if not i_replace and to_regproc('pgque.' || quote_ident(i_name)) is not null then
        return;
    end if;
    begin
        if not i_replace then
            perform set_config('lock_timeout', '50ms', true);
        end if;
        execute format('create or replace function pgque.%I%s as %L', i_name, i_signature, i_body);
        perform set_config('lock_timeout', v_old_lt, true);
    exception
        when unique_violation then
            perform set_config('lock_timeout', v_old_lt, true);
            return; -- made by a concurrent session
        when lock_not_available then
            perform set_config('lock_timeout', v_old_lt, true);
            return; -- being made by an open transaction: left to maintenance
    end;
    execute format('revoke all on function %s from public', to_regproc('pgque.' || quote_ident(i_name))::regprocedure);
end;
$$;

-- _make_reader(queue_id, nslots, replace): creates the queue's reader for
-- nslots (1 for plain consumers), or replaces it when replace is true
-- (_make_function). Its text holds only the two integers, put into
-- _reader_src() by format().
create or replace function pgque._make_reader(i_queue_id integer, i_nslots integer, i_replace boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_queue_id is null or i_nslots is null or i_nslots < 1 then
        raise exception using errcode = '22023', message = format('no reader for queue %s and %s slots', i_queue_id, i_nslots);
    end if;
    perform pgque._make_function(format('_read_%s_%s', i_queue_id, i_nslots), $sig$(
    st pgque.sub_state, v_prev pg_catalog.pg_snapshot, v_cur pg_catalog.pg_snapshot,
    v_xip pg_catalog.xid8[], v_sub integer, i_slot integer, i_max integer, v_budget bigint)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off$sig$,
        format(pgque._reader_src(), i_queue_id, i_nslots), i_replace);
end;
$$;

-- _readers(): the readers that exist: function, queue id, N.
create or replace function pgque._readers()
returns table (fn regprocedure, queue_id integer, nslots integer) language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select p.oid::regprocedure, m[1]::integer, m[2]::integer
      from pg_catalog.pg_proc p
      cross join lateral pg_catalog.regexp_match(p.proname, '^_read_([0-9]+)_([0-9]+)$') m
     where p.pronamespace = 'pgque'::regnamespace and m is not null
$$;

-- _drop_orphans(pattern): drops the functions of schema pgque whose name
-- matches pattern, a constant whose first group is a queue id, when that
-- queue no longer exists: the readers here, the partition layer's key
-- readers. Returns how many.
create or replace function pgque._drop_orphans(i_pattern text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r   record;
    v_n integer := 0;
begin
    for r in
        select p.oid::regprocedure as fn
          from pg_catalog.pg_proc p
          cross join lateral pg_catalog.regexp_match(p.proname, i_pattern) m
         where p.pronamespace = 'pgque'::regnamespace and m is not null
           and not exists (select 1 from pgque.queue q where q.queue_id = m[1]::integer)
    loop
        execute format('drop function if exists %s', r.fn);
        v_n := v_n + 1;
    end loop;
    return v_n;
end;
$$;

-- _maint_readers(): drops the readers of queues that no longer exist, and
-- makes the reader for plain consumers of a queue that has a subscription
-- and none (a subscribe left it to maintenance: _make_reader). A 'maint'
-- hook. Returns how many it dropped or made.
create or replace function pgque._maint_readers()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r   record;
    v_n integer := pgque._drop_orphans('^_read_([0-9]+)_[0-9]+$');
begin
    for r in
        select q.queue_id from pgque.queue q
         where pg_catalog.to_regproc(pg_catalog.format('pgque._read_%s_1', q.queue_id)) is null
           and exists (select 1 from pgque.subscription s where s.sub_queue = q.queue_id)
    loop
        perform pgque._make_reader(r.queue_id, 1, false);
        v_n := v_n + 1;
    end loop;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'readers', 'pgque._maint_readers()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- Every reader of the install is made again from this version's statement.
select pgque._make_reader(x.queue_id, x.nslots, true)
  from (select queue_id, 1 as nslots from pgque.queue
        union
        select r.queue_id, r.nslots from pgque._readers() r
         where exists (select 1 from pgque.queue q where q.queue_id = r.queue_id)) x;

-- _as_messages(queue, subscription, max, slot, nslots, span): the chunk
-- _deliver_raw hands out, with payloads as jsonb, for the functions whose
-- contract is jsonb (receive, receive_partitioned). Data that jsonb cannot
-- hold (only insert_event can store it: text that is not JSON, a \u0000
-- escape, a number out of range, nesting past the stack limit) comes as a
-- JSON string of the stored text: the chunk is then read again, and its
-- state appended again, in place of the failed attempt (one subtransaction
-- per chunk, none per row). The chunk is collected before it is returned,
-- so a failed attempt returns nothing.
create or replace function pgque._as_messages(i_queue text, i_sub text, i_max integer,
                                              i_slot integer, i_nslots integer, i_span bigint)
returns pgque.message[] language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_rows pgque.message[];
begin
    begin
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, d.payload::jsonb, d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._deliver_raw(i_queue, i_sub, i_max, i_slot, i_nslots, i_span) d);
    exception when data_exception or program_limit_exceeded then
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, pgque._payload(d.payload), d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._deliver_raw(i_queue, i_sub, i_max, i_slot, i_nslots, i_span) d);
    end;
    return v_rows;
end;
$$;
