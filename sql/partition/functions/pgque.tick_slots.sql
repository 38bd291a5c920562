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
-- the function's time).
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
    -- The batch's events, as the read path finds them: a range of ev_txid
    -- from the previous tick's xmax, and the transactions it saw running.
    -- "ev_txid = any('{}')" is planned as a scan, hence the sentinel 0.
    v_xip := array(select pg_snapshot_xip(v_prev)) || '0'::xid8;
    -- Each key's hash (_slot_of's), not the key: a key is any text a
    -- writer sends, and 4·N + 1 long ones collected whole made an array
    -- over PostgreSQL's 1 GB, so that every ticker() call, the tick of every
    -- queue, failed for as long as they stayed in the batch.
    v_hash := array(
        select case when u.ev_extra1 is not null then hashtextextended(u.ev_extra1, 0) end from (
            select ev.ev_extra1, ev.ev_txid from pgque.event ev
             where ev.ev_part >= pgque._part_lo(i_queue_id) and ev.ev_part < pgque._part_hi(i_queue_id)
               and ev.ev_txid >= pg_snapshot_xmax(v_prev) and ev.ev_txid < pg_snapshot_xmax(v_cur)
            union all
            select ev.ev_extra1, ev.ev_txid from pgque.event ev
             where ev.ev_part >= pgque._part_lo(i_queue_id) and ev.ev_part < pgque._part_hi(i_queue_id)
               and cardinality(v_xip) > 1 and ev.ev_txid = any(v_xip)) u
         where pg_visible_in_snapshot(u.ev_txid, v_cur)
         limit v_cap + 1);
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
