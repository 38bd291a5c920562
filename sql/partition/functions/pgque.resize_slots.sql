-- Online resize of a slot group: N old slots hand over to M new ones while
-- producers send and workers consume, keeping G1 and G2 across the change.
--
--   resize_slots          seal tick S made; old slots sealed at S (their
--        │                batches end there); M new subscriptions start at
--        ▼                S, with no lease yet, so nobody can work them
--   draining ───────────  old slots consume up to S; held lanes settle
--        │                (every old cursor at S, no batch open, no key
--        ▼                 held inflight)
--   cutover (one txn) ──  retries, deferred events, blocked/releasing keys
--        │                and owned events in the log after S move to the
--        │                new slot of their key; dead letters are renamed;
--        ▼                old subscriptions dropped; new leases created
--   done                  N = M; workers learn it from PQ030 / the group
--
-- Every event visible in S's snapshot belongs to an old slot, every later
-- one to a new slot; a new slot gets no lease before every old one is done,
-- so no key is handled by an old and a new slot at once, and a key's state
-- that outlives its old slot (a retry, a blocked head and its deferred
-- events, events put back after S) is carried to its new slot, where the
-- key's block row keeps later events behind it exactly as on the old slot.
-- The cutover is attempted by every empty receive of an old slot and by
-- maint(), so no step is manual and a crash only delays it.

-- _resize_group(queue_id, consumer): the slot group, locked, or PQ071.
create or replace function pgque._resize_group(i_queue text, i_consumer text)
returns pgque.slot_group language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    g pgque.slot_group;
begin
    select g1.* into g from pgque.slot_group g1 join pgque.queue q on q.queue_id = g1.sg_queue
     where q.queue_name = i_queue and g1.sg_consumer = i_consumer
       for update of g1;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ071',
            message = format('consumer %L has no slots on queue %L; nothing to resize', i_consumer, i_queue);
    end if;
    return g;
end;
$$;

-- resize_slots(queue, consumer, new_nslots): starts an online resize of the
-- consumer's slots to new_nslots. Makes the seal tick, seals the old slots'
-- subscriptions there and registers the new slots' subscriptions at it
-- (without leases). Workers keep working; the cutover happens by itself
-- once the old slots are done. Raises PQ071 for a consumer without slots,
-- PQ070 when a resize is already in progress, PQ072 when new_nslots is the
-- current N, PQ051 when the queue would need a fifth distinct N, PQ074 when
-- a subscription of a new slot exists already, PQ011/22004 for a bad N.
-- Returns the seal tick. Tables: slot_group, subscription, tick, sub_state.
create or replace function pgque.resize_slots(i_queue text, i_consumer text, i_new_nslots integer)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q      pgque.queue;
    g      pgque.slot_group;
    v_seal bigint;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    q := pgque._queue(i_queue);
    perform pgque._check_consumer(i_consumer);
    if i_new_nslots is null then
        raise exception using errcode = '22004', message = 'new nslots must not be NULL';
    end if;
    perform pgque._check_slot(0, i_new_nslots);
    perform pgque._check_slot_consumer(i_consumer, i_new_nslots);
    g := pgque._resize_group(i_queue, i_consumer);
    if g.sg_resize_to is not null then
        raise exception using errcode = 'PQ070',
            message = format('consumer %L on queue %L is already being resized from %s to %s slots (since %s)',
                             i_consumer, i_queue, g.sg_nslots, g.sg_resize_to, g.sg_resize_started);
    end if;
    if g.sg_nslots = i_new_nslots then
        raise exception using errcode = 'PQ072',
            message = format('consumer %L on queue %L already has %s slots', i_consumer, i_queue, i_new_nslots);
    end if;
    update pgque.slot_group set sg_resize_to = i_new_nslots, sg_resize_started = clock_timestamp()
     where sg_queue = q.queue_id and sg_consumer = i_consumer;

    -- The seal tick: made here, under the queue row's lock (kept until
    -- commit), so it is the latest tick when the new slots register below.
    v_seal := pgque._tick(q.queue_id, true);
    update pgque.subscription s set sub_until_tick = v_seal
      from pgque.slot_lease l
     where l.sl_queue = q.queue_id and l.sl_consumer = i_consumer and s.sub_id = l.sl_sub;
    for v_slot in 0 .. i_new_nslots - 1 loop
        if pgque.register_consumer(i_queue, pgque._slot_name(i_consumer, v_slot, i_new_nslots)) = 0 then
            raise exception using errcode = 'PQ074',
                message = format('subscription %L exists already; unsubscribe it before resizing to %s slots',
                                 pgque._slot_name(i_consumer, v_slot, i_new_nslots), i_new_nslots);
        end if;
    end loop;
    update pgque.slot_group set sg_seal_tick = v_seal
     where sg_queue = q.queue_id and sg_consumer = i_consumer;
    perform pgque._make_reader(q.queue_id, i_new_nslots, false); -- see api/functions/pgque.deliver_raw.sql
    -- The new N's routing indexes: asked of the ticker, which builds them
    -- once this transaction committed (_route_index).
    perform pgque._route_index(q.queue_id, i_new_nslots, true);
    return v_seal;
end;
$$;

-- _resize_drained(queue_id, consumer, seal): how many old slots are done
-- (cursor at the seal, no batch open) and how many keys are still held
-- by a running lane on them.
create or replace function pgque._resize_drained(i_queue_id integer, i_consumer text, i_seal bigint,
                                                 out o_total integer, out o_done integer, out o_held integer)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    select count(*), count(*) filter (where st.st_batch is null and st.st_last_tick >= i_seal)
      into o_total, o_done
      from pgque.slot_lease l cross join lateral pgque._sub_state(l.sl_sub) st
     where l.sl_queue = i_queue_id and l.sl_consumer = i_consumer;
    select count(*) into o_held
      from pgque.key_block kb join pgque.slot_lease l on l.sl_sub = kb.kb_sub
     where l.sl_queue = i_queue_id and l.sl_consumer = i_consumer and kb.kb_state = 'inflight';
end;
$$;

-- _resize_try(queue_id, consumer): completes the group's resize when every
-- old slot is done. Never waits for another cutover attempt (the group row
-- is taken with SKIP LOCKED) and waits at most 200 ms for the old slots'
-- lease rows (their owners' calls are short). Returns true when the
-- cutover happened here. Tables: slot_group, slot_lease, subscription,
-- retry_queue, deferred, key_block, event, dead_letter.
create or replace function pgque._resize_try(i_queue_id integer, i_consumer text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    g        pgque.slot_group;
    d        record;
    v_old_lt text := current_setting('lock_timeout');
begin
    select * into g from pgque.slot_group
     where sg_queue = i_queue_id and sg_consumer = i_consumer and sg_resize_to is not null
       for update skip locked;
    if not found or g.sg_seal_tick is null then
        return false;
    end if;
    d := pgque._resize_drained(i_queue_id, i_consumer, g.sg_seal_tick);
    if d.o_done < d.o_total or d.o_held > 0 then
        return false;
    end if;
    begin
        perform set_config('lock_timeout', '200ms', true);
        perform 1 from pgque.slot_lease where sl_queue = i_queue_id and sl_consumer = i_consumer
         order by sl_slot for update;
        perform set_config('lock_timeout', v_old_lt, true);
    exception when lock_not_available then
        perform set_config('lock_timeout', v_old_lt, true);
        return false;
    end;
    -- Under the leases nothing of the old slots moves any more: check again.
    d := pgque._resize_drained(i_queue_id, i_consumer, g.sg_seal_tick);
    if d.o_done < d.o_total or d.o_held > 0 then
        return false;
    end if;
    perform pgque._resize_cutover(g);
    return true;
end;
$$;

-- _resize_cutover(group): the cutover, with the group and every old lease
-- row locked and every old slot done. Moves what outlives the old slots to
-- the new slot of each key, in an order that lets every concurrent writer
-- of those rows finish first: key blocks (operators' unblock_key and
-- retry_key_now lock them), retries (maint_retry_events deletes them),
-- deferred events, then the old slots' own events in the log after the
-- seal, read last with a fresh snapshot. Then drops the old subscriptions,
-- creates the new leases (epochs above every old one) and sets N.
create or replace function pgque._resize_cutover(g pgque.slot_group)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q       pgque.queue;
    v_old   integer[];
    v_names text[];
    v_new   integer[];
    v_m     integer := g.sg_resize_to;
    v_snap  pg_snapshot;
    v_epoch bigint;
    v_n     integer;
begin
    select * into q from pgque.queue where queue_id = g.sg_queue;
    select array_agg(l.sl_sub order by l.sl_slot), array_agg(s.sub_name order by l.sl_slot), max(l.sl_epoch)
      into v_old, v_names, v_epoch
      from pgque.slot_lease l join pgque.subscription s on s.sub_id = l.sl_sub
     where l.sl_queue = g.sg_queue and l.sl_consumer = g.sg_consumer;
    select array_agg(s.sub_id order by k) into v_new
      from generate_series(0, v_m - 1) k
      join pgque.subscription s on s.sub_queue = g.sg_queue
                               and s.sub_name = pgque._slot_name(g.sg_consumer, k, v_m);
    if cardinality(v_new) is distinct from v_m then
        raise exception using errcode = 'PQ074',
            message = format('the subscriptions of the %s new slots of consumer %L are incomplete', v_m, g.sg_consumer);
    end if;
    select tick_snapshot into v_snap from pgque.tick where tick_queue = g.sg_queue and tick_id = g.sg_seal_tick;

    with moved as (
        delete from pgque.key_block kb where kb.kb_sub = any(v_old) returning kb.*
    )
    insert into pgque.key_block (kb_sub, kb_kid, kb_key, kb_state, kb_head, kb_wait, kb_wait_batch,
                                 kb_since, kb_failures, kb_reason, kb_epoch)
    select v_new[pgque.slot_of(m.kb_key, v_m) + 1], m.kb_kid, m.kb_key, m.kb_state, m.kb_head, m.kb_wait, null,
           m.kb_since, m.kb_failures, m.kb_reason, null
      from moved m;

    with moved as (
        delete from pgque.retry_queue r where r.ev_owner = any(v_old) returning r.*
    )
    insert into pgque.retry_queue (ev_owner, ev_id, ev_queue, ev_retry_after, ev_time, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    select v_new[pgque.slot_of(m.ev_extra1, v_m) + 1], m.ev_id, m.ev_queue, m.ev_retry_after, m.ev_time, m.ev_retry,
           m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4
      from moved m
     -- A held copy of an event completed in a transaction (complete_in_tx)
     -- is done: it is dropped, not handed to the new slot.
     where not exists (select 1 from pgque.event_done dn where dn.dn_sub = m.ev_owner and dn.dn_ev_id = m.ev_id)
    on conflict (ev_owner, ev_id) do nothing;

    with moved as (
        delete from pgque.deferred d where d.ev_owner = any(v_old) returning d.*
    )
    insert into pgque.deferred (ev_owner, ev_id, ev_group, ev_queue, ev_time, ev_retry, ev_type, ev_data,
                                ev_extra1, ev_extra2, ev_extra3, ev_extra4, deferred_at)
    select v_new[pgque.slot_of(m.ev_extra1, v_m) + 1], m.ev_id, m.ev_group, m.ev_queue, m.ev_time, m.ev_retry,
           m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4, m.deferred_at
      from moved m
    on conflict (ev_owner, ev_id) do nothing;

    -- Events only an old slot sees (retries and released events put into
    -- the log after the seal): a copy for the key's new slot. The old
    -- copies stay in the log, seen by nobody, until rotation.
    insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                             ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    select e.ev_id, e.ev_time, pgque._part(q.queue_id, q.queue_cur_table), v_new[pgque.slot_of(e.ev_extra1, v_m) + 1],
           e.ev_retry, e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4
      from pgque.event e
     where e.ev_part >= pgque._part_lo(q.queue_id) and e.ev_part < pgque._part_hi(q.queue_id)
       and e.ev_owner = any(v_old)
       and e.ev_txid >= pg_snapshot_xmin(v_snap) and not pg_visible_in_snapshot(e.ev_txid, v_snap)
     order by e.ev_id;
    get diagnostics v_n = row_count;
    if v_n > 0 then
        perform nextval(q.queue_event_seq);
    end if;

    -- Dead letters name the slot they failed on; rename them to the key's
    -- new slot, so dlq_replay finds a subscription.
    update pgque.dead_letter dl
       set dl_consumer = pgque._slot_name(g.sg_consumer, pgque.slot_of(dl.ev_extra1, v_m), v_m)
     where dl.dl_queue = g.sg_queue and dl.dl_consumer = any(v_names);

    delete from pgque.subscription where sub_id = any(v_old);
    insert into pgque.slot_lease (sl_queue, sl_consumer, sl_slot, sl_sub, sl_epoch)
    select g.sg_queue, g.sg_consumer, k - 1, v_new[k], coalesce(v_epoch, 0) + 1
      from generate_subscripts(v_new, 1) k;
    update pgque.slot_group
       set sg_past_nslots = array_append(array_remove(sg_past_nslots, sg_nslots), sg_nslots),
           sg_nslots = v_m, sg_resize_to = null, sg_seal_tick = null, sg_resized_at = clock_timestamp()
     where sg_queue = g.sg_queue and sg_consumer = g.sg_consumer;
    -- Wake the workers: their next call on an old slot fails with PQ030 and
    -- they take up the new N.
    if pg_notification_queue_usage() < 0.5 then
        perform pg_notify('pgque', pgque._tick_tag(q.queue_name));
        -- And every slot, for workers that wake only the touched ones
        -- (pgque.tick_slots.sql).
        perform pg_notify('pgque_slots', pgque._tick_tag(q.queue_name) || ':*');
    end if;
end;
$$;

-- _resize_poll(lease): called by an old slot's receive that found nothing:
-- attempts the cutover when the slot's group is being resized.
create or replace function pgque._resize_poll(l pgque.slot_lease)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if exists (select 1 from pgque.slot_group where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer
                                                 and sg_resize_to is not null) then
        perform pgque._resize_try(l.sl_queue, l.sl_consumer);
    end if;
end;
$$;

-- _maint_resize(): the maint() hook: attempts the cutover of every group
-- being resized. Returns how many completed.
create or replace function pgque._maint_resize()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r   record;
    v_n integer := 0;
begin
    for r in select sg_queue, sg_consumer from pgque.slot_group where sg_resize_to is not null
              order by sg_queue, sg_consumer loop
        if pgque._resize_try(r.sg_queue, r.sg_consumer) then
            v_n := v_n + 1;
        end if;
    end loop;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'slot_resize', 'pgque._maint_resize()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- slot_group_info(queue, consumer): the consumer's N, failure policy and
-- resize state: the target N while a resize is in progress (NULL
-- otherwise) and every N it had before. What a worker pool reads to follow
-- a resize. PQ034 when the consumer has no slots.
create or replace function pgque.slot_group_info(i_queue text, i_consumer text)
returns table (nslots integer, policy text, resize_to integer, past_nslots integer[])
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    return query
    select g.sg_nslots, g.sg_policy, g.sg_resize_to, g.sg_past_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
end;
$$;

-- resize_status(queue): the resizes of a queue's consumers (of every
-- queue when NULL): in progress (phase draining while old slots still
-- consume up to the seal, settling while held lanes finish, cutover when
-- it is due at the next empty receive or maint()) and the last completed
-- one (phase done). A confined queue: 42501 when named, left out of the
-- list otherwise, for a login that may not read it (_authorize_read).
create or replace function pgque.resize_status(i_queue text default null)
returns table (queue text, consumer text, nslots integer, resize_to integer, phase text, seal_tick bigint,
               started timestamptz, finished timestamptz, slots_done integer, slots_total integer,
               held_keys integer, blocked_keys integer)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    r record;
    d record;
begin
    if i_queue is not null then
        perform pgque._authorize_read(i_queue);
        perform pgque._queue(i_queue);
    end if;
    for r in select q.queue_name, q.queue_id, g.*
               from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
              where (i_queue is null or q.queue_name = i_queue) and pgque._may_read(q.queue_id)
                and (g.sg_resize_to is not null or g.sg_resized_at is not null)
              order by q.queue_name, g.sg_consumer loop
        queue := r.queue_name;
        consumer := r.sg_consumer;
        nslots := r.sg_nslots;
        resize_to := r.sg_resize_to;
        seal_tick := r.sg_seal_tick;
        started := r.sg_resize_started;
        blocked_keys := (select count(*) from pgque.key_block kb join pgque.slot_lease l on l.sl_sub = kb.kb_sub
                          where l.sl_queue = r.queue_id and l.sl_consumer = r.sg_consumer and kb.kb_state <> 'inflight');
        if r.sg_resize_to is null then
            phase := 'done';
            finished := r.sg_resized_at;
            slots_done := r.sg_nslots;
            slots_total := r.sg_nslots;
            held_keys := 0;
        else
            d := pgque._resize_drained(r.queue_id, r.sg_consumer, coalesce(r.sg_seal_tick, 9223372036854775807));
            finished := null;
            slots_done := d.o_done;
            slots_total := d.o_total;
            held_keys := d.o_held;
            phase := case when d.o_done < d.o_total then 'draining' when d.o_held > 0 then 'settling' else 'cutover' end;
        end if;
        return next;
    end loop;
end;
$$;
