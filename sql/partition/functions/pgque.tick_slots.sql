-- Touched slots: a tick says which slots it concerns, so that only those
-- wake (docs/design.md, "Wake-ups proportional to work").
--
-- _tick_slots(queue_id, tick_id): the 'tick' hook (engine/functions/
-- pgque.layer_hook.sql). For each slot count N in use on the queue,
-- computes the set of slots that have
-- events in the batch between the previous tick and this one (the batch
-- predicate: visible in this tick's snapshot, not in the previous one's)
-- and notifies channel "pgque_slots" with
--
--     <tag>:<N>=<hex>[,<N>=<hex>...]   or   <tag>:*
--
-- <tag> is pgque._tick_tag(queue); <hex> is N bits in ceil(N/4) hex
-- digits, slot 4j+b being bit 8 >> b of digit j (slot 0 the first
-- digit's high bit). "*" means every slot: the tick holds more than 4·N
-- events, found by reading at most 4·N + 1 of them (nearly every slot
-- is touched anyway, and reading them all would cost more than the
-- wake-ups it saves), it has no previous tick, or a slot group of the
-- queue is being resized. A tick that touches no slot sends nothing. The
-- engine's notification on channel "pgque" is unchanged, for clients that
-- wake every slot on it.
-- The set only decides who is woken: batch membership is still fixed by
-- the two snapshots, and a lost or skipped notification costs latency
-- (consumers poll), never events.
--
-- Params: i_queue_id, i_tick_id (the tick just written, in this
-- transaction). Returns nothing. Reads pgque.slot_group, pgque.tick and
-- the queue's events (the (ev_txid, ev_id) index); writes nothing. Not
-- granted: the ticker calls it, as the owner.
-- Generic plans only: the set's statement takes arrays as parameters, and
-- the planner's custom plans for it were replanned on every tick (half of
-- the function's time). The batch's keys are read by the queue's key
-- reader (below), not by a statement here.
-- _slots_hex(nslots, slots): the <hex> of a touched set naming slots of
-- nslots (see above): ceil(nslots/4) hex digits, slot 4j+b bit 8 >> b of
-- digit j. Also what a receive that leaves its slot behind sends
-- (receive_partitioned_raw, "One call per wake-up" in docs/design.md).
create or replace function pgque._slots_hex(i_nslots integer, i_slots integer[])
returns text language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_digits integer[] := array_fill(0, array[(i_nslots + 3) / 4]);
    v_slot   integer;
    v_hex    text := '';
begin
    foreach v_slot in array i_slots loop
        v_digits[v_slot / 4 + 1] := v_digits[v_slot / 4 + 1] | (8 >> (v_slot % 4));
    end loop;
    for j in 1 .. cardinality(v_digits) loop
        v_hex := v_hex || to_hex(v_digits[j]);
    end loop;
    return v_hex;
end;
$$;

-- Key readers. _tick_slots reads the hashes of the batch's keys from the
-- queue's events. Written in _tick_slots, under its generic plans, with
-- the queue id a parameter, that statement's plan held every partition of
-- pgque.event: PostgreSQL locks all of a generic plan's partitions before
-- it prunes them, so each tick of a queue with slot consumers locked
-- every queue's tables and indexes (8 133 locks with 900 queues, 4.1 ms a
-- tick against 1.6 ms with 5 queues; past about a thousand queues "out
-- of shared memory"). Planned for each tick with the id as a constant
-- (EXECUTE), it cost every tick 0.5 ms more at any size. So each queue
-- with slot consumers gets a key reader, pgque._slot_keys_<queue id>:
-- the statement with the queue id written in as a number, whose generic
-- plan, made once per session, holds the queue's three tables alone.
-- _make_slot_keys makes it when the queue gets its first slot group
-- (subscribe_slot), the install remakes every one from this version's
-- statement, and maint() (_maint_slot_keys) drops those of dropped
-- queues and makes one a subscribe left out. Until it exists _tick_slots
-- plans the statement for the tick (the EXECUTE above). As with the
-- delivery readers (api/functions/pgque.deliver_raw.sql), the only text
-- put into the body is the queue id, an integer. Not granted.

-- _slot_keys_src(): the statement, with %1$s for the queue id and $1..$4
-- for the previous and current tick snapshots, the previous one's running
-- transaction ids (a sentinel 0 appended: "ev_txid = any('{}')" is
-- planned as a scan) and the most hashes to return. Each key's hash
-- (_slot_of's), not the key: a key is any text a writer sends, and 4·N +
-- 1 long ones collected whole made an array over PostgreSQL's 1 GB, so
-- that every ticker() call, the tick of every queue, failed for as long
-- as they stayed in the batch. The events are the batch's as the read
-- path finds them: a range of ev_txid from the previous tick's xmax, and
-- the transactions it saw running.
create or replace function pgque._slot_keys_src()
returns text language sql immutable
as $src$ select $q$array(
        select case when u.ev_extra1 is not null then pg_catalog.hashtextextended(u.ev_extra1, 0) end from (
            select ev.ev_extra1, ev.ev_txid from pgque.event ev
             where ev.ev_part >= pgque._part_lo(%1$s) and ev.ev_part < pgque._part_hi(%1$s)
               and ev.ev_txid >= pg_catalog.pg_snapshot_xmax($1) and ev.ev_txid < pg_catalog.pg_snapshot_xmax($2)
            union all
            select ev.ev_extra1, ev.ev_txid from pgque.event ev
             where ev.ev_part >= pgque._part_lo(%1$s) and ev.ev_part < pgque._part_hi(%1$s)
               and pg_catalog.cardinality($3) > 1 and ev.ev_txid = any($3)) u
         where pg_catalog.pg_visible_in_snapshot(u.ev_txid, $2)
         limit $4)$q$ $src$;

-- _make_slot_keys(queue_id, replace): creates the queue's key reader, or
-- replaces it when replace is true (_make_function, in api/functions/
-- pgque.deliver_raw.sql: a second session making it at once finds it made
-- or leaves it to maint()).
create or replace function pgque._make_slot_keys(i_queue_id integer, i_replace boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_queue_id is null then
        raise exception using errcode = '22023', message = 'no key reader for a NULL queue id';
    end if;
    perform pgque._make_function(format('_slot_keys_%s', i_queue_id), $sig$(
    pg_catalog.pg_snapshot, pg_catalog.pg_snapshot, pg_catalog.xid8[], integer)
returns bigint[] language plpgsql stable
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan$sig$,
        format('begin return %s; end;', format(pgque._slot_keys_src(), i_queue_id)), i_replace);
end;
$$;

-- _maint_slot_keys(): drops the key readers of queues that no longer
-- exist and makes the missing one of a queue with a slot group. A 'maint'
-- hook. Returns how many it dropped or made (or left to a later call).
create or replace function pgque._maint_slot_keys()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_made integer;
begin
    perform pgque._make_slot_keys(g.sg_queue, false)
       from (select distinct sg_queue from pgque.slot_group) g
      where pg_catalog.to_regproc(pg_catalog.format('pgque._slot_keys_%s', g.sg_queue)) is null;
    get diagnostics v_made = row_count;
    return pgque._drop_orphans('^_slot_keys_([0-9]+)$') + v_made;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'slot_keys', 'pgque._maint_slot_keys()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- Every key reader of the install is made again from this version's
-- statement, and a queue with slot groups and none gets one.
select pgque._make_slot_keys(g.sg_queue, true) from (select distinct sg_queue from pgque.slot_group) g;

create or replace function pgque._tick_slots(i_queue_id integer, i_tick_id bigint)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
    v_ns    integer[];
    v_prev  pg_snapshot;
    v_cur   pg_snapshot;
    v_cap   integer;
    v_xip   xid8[];
    v_hash  bigint[];
    v_set   text;
    v_tag   text;
    v_keys  regproc;
begin
    -- Past half full, the NOTIFY queue is left to drain (as the ticker's
    -- own notification is, pgque._notify_max_usage).
    if pg_notification_queue_usage() >= pgque._notify_max_usage() then
        return;
    end if;
    select array_agg(distinct g.sg_nslots order by g.sg_nslots) into v_ns
      from pgque.slot_group g where g.sg_queue = i_queue_id;
    if v_ns is null then
        return; -- no slot group on the queue: nobody to tell
    end if;
    v_tag := pgque._tick_tag((select q.queue_name from pgque.queue q where q.queue_id = i_queue_id));
    -- During a resize every old slot must come to the seal and find its
    -- batches empty for the cutover (_resize_poll): wake them all.
    if exists (select 1 from pgque.slot_group g where g.sg_queue = i_queue_id and g.sg_resize_to is not null) then
        perform pg_notify('pgque_slots', v_tag || ':*');
        return;
    end if;
    select p.tick_snapshot, c.tick_snapshot into v_prev, v_cur
      from (select t.tick_snapshot from pgque.tick t
             where t.tick_queue = i_queue_id and t.tick_id < i_tick_id
             order by t.tick_id desc limit 1) p,
           (select t.tick_snapshot from pgque.tick t
             where t.tick_queue = i_queue_id and t.tick_id = i_tick_id limit 1) c;
    v_cap := 4 * v_ns[cardinality(v_ns)];
    if v_prev is null then
        perform pg_notify('pgque_slots', v_tag || ':*');
        return;
    end if;
    -- "ev_txid = any('{}')" is planned as a scan, hence the sentinel 0.
    v_xip := array(select pg_snapshot_xip(v_prev)) || '0'::xid8;
    -- The batch's key hashes, from the queue's key reader, or from the
    -- statement planned for this tick until one exists (see "Key
    -- readers" above).
    v_keys := to_regproc(format('pgque._slot_keys_%s', i_queue_id));
    if v_keys is not null then
        execute format('select %s($1, $2, $3, $4)', v_keys) into v_hash using v_prev, v_cur, v_xip, v_cap + 1;
    else
        execute 'select ' || format(pgque._slot_keys_src(), i_queue_id) into v_hash using v_prev, v_cur, v_xip, v_cap + 1;
    end if;
    if cardinality(v_hash) = 0 then
        return;
    end if;
    if cardinality(v_hash) > v_cap then
        perform pg_notify('pgque_slots', v_tag || ':*');
        return;
    end if;
    -- _slot_of of each key, from its hash (NULL for the NULL key).
    select string_agg(n || '=' || pgque._slots_hex(n, array(select coalesce(((h % n + n) % n)::integer, 0)
                                                          from unnest(v_hash) h)),
                      ',' order by n)
      into v_set
      from unnest(v_ns) n;
    perform pg_notify('pgque_slots', v_tag || ':' || v_set);
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('tick', 'touched_slots', 'pgque._tick_slots(integer, bigint)')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;
