-- Per-key visibility: which keys of a consumer have the oldest pending
-- head and why (flowing, in flight, retrying, blocked, held), how a slot's
-- pending work is shared between its keys, and which keys produce the most
-- events right now.
--
-- The functions turn JIT off: their row estimates are guesses (the scans
-- are bounded by budgets the planner cannot see), and compiling a plan
-- costs more than running it. They are VOLATILE and read the cursor from
-- the subscription's state record (_with_state), as every reader of tick
-- and sub_state must (see engine/functions/pgque._state.sql).
--
-- Nothing here is written per event: every answer is computed when asked,
-- from the log itself, with bounded scans. A slot's pending events are read
-- through the routing index (ev_txid, ev_id, (hash expr)) in ev_txid order,
-- so the first rows read are the oldest pending ones (the index entries of
-- other slots in between are tested and skipped, without reading their
-- rows); the scan stops after a budget of rows, and then the counts are
-- lower bounds (estimated = true) while the heads found are still the
-- oldest ones.
--
-- Keys are a queue's data: every public function here first runs the read
-- check (_authorize_read: the consume check of receive; pgque_admin reads
-- every queue), so a confined queue's keys reach only those who may
-- consume it.

-- _slot_keys(sub_id, slot, nslots, scan): the pending events of one slot
-- (the same visibility as _slot_pending: committed after the cursor's tick,
-- retried copies owned by the slot included, the acknowledged chunks of its
-- open batch and the events its chunk out now deferred left out), at most
-- i_scan of them in ev_txid order, grouped by key. The walk reads the
-- acknowledged chunks' rows to skip them: that part of its cost is bounded
-- by the open batch, not by the budget. Per key: its head ev_id and time,
-- how many of its events were seen, how many of those are in the slot's
-- open batch; and for the slot: how many rows were read and whether the
-- budget cut the scan short. The caller validates i_scan; the statement text holds
-- validated integers only.
create or replace function pgque._slot_keys(i_sub integer, i_slot integer, i_nslots integer, i_scan integer)
returns table (key text, head_ev_id bigint, head_time timestamptz, pending bigint, in_batch bigint,
               scanned bigint, truncated boolean)
language plpgsql volatile rows 100
set search_path = pg_catalog, pg_temp
-- Only a walk of the routing index in ev_txid order stops after the budget:
-- a slot's events are spread over every heap page, so the bitmap scan and
-- sort the planner may prefer for a large budget read the whole table.
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    s      pgque.subscription;
    st     pgque.sub_state;
    v_snap pg_snapshot;
    v_next pg_snapshot;
begin
    perform pgque._check_slot(i_slot, i_nslots);
    select * into s from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    st := pgque._sub_state(i_sub);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = st.st_last_tick;
    if st.st_batch is not null then
        select tick_snapshot into v_next from pgque.tick where tick_queue = s.sub_queue and tick_id = st.st_next_tick;
    end if;
    -- Grouped by _kid (a long key's hash), and the key read back from its
    -- head row: a key is a writer's text of any length, stored compressed,
    -- and grouping by the text itself decompressed it again at every
    -- comparison (a minute for 1000 keys of 1 MB).
    return query execute
        'with e as materialized (select ev_id, ev_time, ev_txid, ev_extra1 from pgque.event x'
     || ' where ev_part >= $1 and ev_part < $2 and ev_txid >= $3'
     || ' and not pg_catalog.pg_visible_in_snapshot(ev_txid, $4)'
     || ' and (ev_owner is null or ev_owner = $5)'
     || ' and ($6::pg_catalog.pg_snapshot is null or not pg_catalog.pg_visible_in_snapshot(ev_txid, $6)'
     || ' or (ev_id > $8 and not (ev_id <= $9 and exists (select from pgque.deferred d'
     || ' where d.ev_owner = $5 and d.ev_id = x.ev_id))))'
     || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '')
     || ' order by ev_txid limit $7),'
     || ' g as (select min(ev_id) as head, min(ev_time) as head_time, count(*) as n,'
     || ' count(*) filter (where $6::pg_snapshot is not null and pg_catalog.pg_visible_in_snapshot(ev_txid, $6)) as nb'
     || ' from e group by pgque._kid(ev_extra1))'
     || ' select h.ev_extra1, g.head, g.head_time, g.n, g.nb,'
     || ' (sum(g.n) over ())::bigint, (sum(g.n) over ()) >= $7'
     || ' from g join e h on h.ev_id operator(pg_catalog.=) g.head'
      using pgque._part_lo(s.sub_queue), pgque._part_hi(s.sub_queue), pg_snapshot_xmin(v_snap), v_snap, s.sub_id, v_next, i_scan,
            coalesce(st.st_acked_to, -1), coalesce(st.st_delivered_to, -1);
end;
$$;

-- _key_scan_args(limit, scan): validates the row limits of the key views
-- (PQ011 outside their range, 22004 for NULL).
create or replace function pgque._key_scan_args(i_limit integer, i_scan integer)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_limit is null or i_scan is null then
        raise exception using errcode = '22004', message = 'limit and scan must not be NULL';
    end if;
    if i_limit < 1 or i_limit > 10000 then
        raise exception using errcode = 'PQ011', message = format('limit must be between 1 and 10000, not %s', i_limit);
    end if;
    if i_scan < 1 or i_scan > 100000000 then
        raise exception using errcode = 'PQ011', message = format('scan must be between 1 and 100000000, not %s', i_scan);
    end if;
end;
$$;

-- _key_slots(queue, consumer, slot): the slot group and the chosen slots
-- of a consumer (all when i_slot is NULL). Raises PQ001 for a missing
-- queue, PQ034 when the consumer has no slots, PQ011 for a slot out of
-- range.
create or replace function pgque._key_slots(i_queue text, i_consumer text, i_slot integer)
returns setof pgque.slot_lease language plpgsql volatile rows 16
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    g pgque.slot_group;
begin
    select * into g from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer;
    if not found then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L', i_consumer, i_queue);
    end if;
    if i_slot is not null then
        perform pgque._check_slot(i_slot, g.sg_nslots);
    end if;
    return query select l.* from pgque.slot_lease l
                  where l.sl_queue = q.queue_id and l.sl_consumer = i_consumer
                    and (i_slot is null or l.sl_slot = i_slot)
                  order by l.sl_slot;
end;
$$;

-- key_heads(queue, consumer, slot, limit, scan): the keys of a consumer
-- (one slot, or all when slot is NULL) with the oldest pending head, oldest
-- first, at most i_limit rows. Per key: slot, key (NULL and '' are distinct
-- keys), state, head ev_id and age, pending events (log + retry + deferred),
-- and for failing keys the failures, last reason, when the retry is due and
-- how many events are deferred behind the head. State is, in this order of
-- precedence: 'blocked' (pause policy: the head failed and waits for its
-- retry; every later event is deferred), 'releasing' (pause policy: the
-- head was settled and the deferred events are being put back), 'held'
-- (the key is held while its lane runs: key_block state 'inflight'),
-- 'retrying' (an event of the key waits in the retry queue), 'in flight'
-- (the head is in the slot's open batch), 'flowing'. The words are those
-- of blocked_keys. At most i_scan pending log rows are
-- read in all, split evenly between the slots; estimated is true for a
-- slot whose scan was cut short (its counts are then lower bounds).
-- Reads subscription, tick, slot_group, slot_lease, event, retry_queue,
-- deferred (but for the events a transactional handler of a held key has
-- completed, see _slot_held), key_block, event_done.
create or replace function pgque.key_heads(i_queue text, i_consumer text, i_slot integer default null,
                                           i_limit integer default 20, i_scan integer default 20000)
returns table (slot integer, key text, state text, head_ev_id bigint, head_age interval, pending bigint,
               failures integer, reason text, retry_at timestamptz, deferred bigint, estimated boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_slots integer;
    v_budget integer;
    v_nslots integer;
    v_now    timestamptz := clock_timestamp();
begin
    perform pgque._authorize_read(i_queue);
    perform pgque._key_scan_args(i_limit, i_scan);
    select count(*)::integer into v_slots from pgque._key_slots(i_queue, i_consumer, i_slot);
    select g.sg_nslots into v_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    v_budget := greatest(1, i_scan / greatest(v_slots, 1));
    -- One row per (slot, key) and source (log, retry queue, deferred),
    -- folded by grouping rather than joined: the sources have no
    -- statistics, and a join of two large ones would loop. kid spells the
    -- key with NULL distinct, as key_block does (_kid).
    return query
    with sl as (select * from pgque._key_slots(i_queue, i_consumer, i_slot)),
    src as (
        select sl.sl_slot, pgque._kid(x.key) as kid, x.key,
               x.head_ev_id, x.head_time, x.pending, x.in_batch > 0 as in_batch, false as retrying,
               null::timestamptz as retry_at, 0::bigint as deferred, x.truncated
          from sl cross join lateral pgque._slot_keys(sl.sl_sub, sl.sl_slot, v_nslots, v_budget) x
        union all
        select sl.sl_slot, pgque._kid(rq.ev_extra1), rq.ev_extra1,
               min(rq.ev_id), min(rq.ev_time), count(*), false, true, min(rq.ev_retry_after), 0, false
          from sl join pgque.retry_queue rq on rq.ev_owner = sl.sl_sub
         group by 1, 2, 3
        union all
        select sl.sl_slot, de.ev_group, min(de.ev_extra1), min(de.ev_id), min(de.ev_time), count(*), false, false,
               null, count(*), false
          from sl join pgque.deferred de on de.ev_owner = sl.sl_sub
         where not exists (select from pgque.event_done dn where dn.dn_sub = sl.sl_sub and dn.dn_ev_id = de.ev_id)
         group by 1, 2),
    est as (select src.sl_slot, bool_or(src.truncated) as truncated from src group by 1),
    j as (select src.sl_slot, src.kid, min(src.key) as key, min(src.head_ev_id) as head_ev_id,
                 min(src.head_time) as head_time, sum(src.pending)::bigint as pending,
                 bool_or(src.in_batch) as in_batch, bool_or(src.retrying) as retrying,
                 min(src.retry_at) as retry_at, sum(src.deferred)::bigint as deferred
            from src group by 1, 2)
    select j.sl_slot, j.key,
           case when b.kb_state = 'blocked' then 'blocked'
                when b.kb_state = 'releasing' then 'releasing'
                when b.kb_state = 'inflight' then 'held'
                when j.retrying then 'retrying'
                when j.in_batch then 'in flight'
                else 'flowing' end,
           j.head_ev_id, v_now - j.head_time, j.pending,
           b.kb_failures, b.kb_reason, j.retry_at, j.deferred,
           coalesce(est.truncated, false)
      from j
      left join est on est.sl_slot = j.sl_slot
      left join (select sl.sl_slot, kb.* from sl join pgque.key_block kb on kb.kb_sub = sl.sl_sub) b
        on b.sl_slot = j.sl_slot and b.kb_kid = j.kid
     order by j.head_time nulls last, j.head_ev_id
     limit i_limit;
end;
$$;

-- key_shares(queue, consumer, scan): per slot of a consumer, how many
-- events are pending (from a scan of at most i_scan rows in all, split
-- between the slots; estimated when cut short), the key holding most of
-- them and its share (0..1). A share near 1 on a slot with a large backlog
-- is a hot key: the slot cannot go faster than that key's handler. Reads
-- subscription, tick, slot_group, slot_lease, event.
create or replace function pgque.key_shares(i_queue text, i_consumer text, i_scan integer default 20000)
returns table (slot integer, pending bigint, top_key text, top_pending bigint, share double precision,
               keys bigint, estimated boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_slots integer;
    v_nslots integer;
begin
    perform pgque._authorize_read(i_queue);
    perform pgque._key_scan_args(1, i_scan);
    select count(*)::integer into v_slots from pgque._key_slots(i_queue, i_consumer, null);
    select g.sg_nslots into v_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    -- The keys are a writer's text, of any length: neither collected into
    -- an array (a slot's scanned keys can pass PostgreSQL's 1 GB) nor
    -- carried through a sort (1000 keys of 1 MB took a minute of external
    -- sort passes). Each slot's top key is found by its (pending, head)
    -- alone, then read back by its head.
    return query
    with x as materialized (
        select sl.sl_slot, k.key, k.pending, k.scanned, k.head_ev_id, k.truncated
          from pgque._key_slots(i_queue, i_consumer, null) sl
          left join lateral pgque._slot_keys(sl.sl_sub, sl.sl_slot, v_nslots, greatest(1, i_scan / greatest(v_slots, 1))) k
            on true),
    a as (
        select x.sl_slot, max(x.scanned) as scanned, max(x.pending) as top_pending,
               count(x.head_ev_id) as nkeys, bool_or(x.truncated) as truncated,
               (min(array[-x.pending, x.head_ev_id]))[2] as top_head
          from x group by x.sl_slot)
    select a.sl_slot, coalesce(a.scanned, 0)::bigint, t.key, coalesce(a.top_pending, 0)::bigint,
           case when coalesce(a.scanned, 0) = 0 then 0::double precision
                else a.top_pending::double precision / a.scanned end,
           a.nkeys, coalesce(a.truncated, false)
      from a left join x t on t.sl_slot = a.sl_slot and t.head_ev_id = a.top_head
     order by a.sl_slot;
end;
$$;

-- hot_keys(queue, window, limit, sample): the keys that produced the most
-- events in the last i_window (new events only, not retried copies), at
-- most i_limit, busiest first: events, rate per second and share of the
-- window's events. At most i_sample of the newest events are read (through
-- the ev_txid index, newest first); when the window holds more, the window
-- is shortened to the span the sample covers and estimated is true.
-- Reads only the event tables written during the window: every row of a
-- table retired at T was written by a transaction that began before T
-- (ev_time is its start), and tables not read are not locked, so a
-- caller's open transaction does not hold back the rotation of a table
-- older than its window. The statement is planned with the table list
-- known (EXECUTE), so the planner locks those partitions only.
-- Reads queue, event.
create or replace function pgque.hot_keys(i_queue text, i_window interval default '1 minute',
                                          i_limit integer default 10, i_sample integer default 20000)
returns table (key text, events bigint, rate double precision, share double precision,
               span interval, estimated boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_ok     boolean := pgque._authorize_read(i_queue);
    q        pgque.queue := pgque._queue(i_queue);
    v_window interval;
    v_now    timestamptz := clock_timestamp();
    v_parts  integer[];
begin
    perform pgque._key_scan_args(i_limit, i_sample);
    if i_window is null then
        raise exception using errcode = '22004', message = 'window must not be NULL';
    end if;
    if i_window <= interval '0' then
        raise exception using errcode = 'PQ011',
            message = format('window must be more than 0 and at most 1 day, not %s', i_window);
    end if;
    v_window := pgque._check_interval('window', i_window, interval '1 microsecond', interval '1 day');
    -- A table never retired since queue_retired exists stopped being
    -- written at queue_switch_time at the latest.
    v_parts := array(select pgque._part(q.queue_id, n) from generate_series(0, q.queue_ntables - 1) n
                      where n = q.queue_cur_table
                         or coalesce(q.queue_retired[n + 1], q.queue_switch_time) >= v_now - v_window);
    return query execute
    'with e as (select ev.ev_time, ev.ev_extra1 from pgque.event ev
                 where ev.ev_part = any ($1) and ev.ev_owner is null
                 order by ev.ev_txid desc limit $2),
     w as (select * from e where e.ev_time >= $3 - $4),
     t as (select count(*) as n, count(*) >= $2 as cut,
                  case when count(*) >= $2 then $3 - min(w.ev_time) else $4 end as span
             from w)
     select w.ev_extra1, count(*),
            count(*) / greatest(extract(epoch from t.span), 0.001)::double precision,
            count(*)::double precision / t.n, t.span, t.cut
       from w cross join t
      group by w.ev_extra1, t.n, t.span, t.cut
      order by count(*) desc, w.ev_extra1 nulls first
      limit $5'
    using v_parts, i_sample, v_now, v_window, i_limit;
end;
$$;

-- _slot_head(sub_id, slot, nslots): the first pending event of one slot in
-- ev_txid order (its ev_id and ev_time), NULL when nothing is pending. Pending
-- is what _slot_pending counts except that the acknowledged chunks of an
-- open batch are not skipped (that would read their rows): a slot part way
-- through a batch has its head at the batch's first event, which says how
-- long it has been behind, what the claim order wants. Spelled so that an
-- index probe answers it:
-- an event is not visible in the cursor's snapshot exactly when its
-- transaction is at or after the snapshot's xmax, or was in progress at the
-- tick (the snapshot's xip list). Two probes of the routing index, each
-- walking the index entries from the snapshot's xmax (or of the xip list)
-- to the slot's first: the entries of other slots ahead of it are tested
-- on the index and skipped, so a slot with nothing pending behind a large
-- backlog of other slots walks that backlog's entries (no row is read).
create or replace function pgque._slot_head(i_sub integer, i_slot integer, i_nslots integer,
                                            out o_ev_id bigint, out o_time timestamptz)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    s      pgque.subscription;
    v_snap pg_snapshot;
    v_from text;
begin
    perform pgque._check_slot(i_slot, i_nslots);
    select * into s from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    s := pgque._with_state(s);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    v_from := 'select ev_id, ev_time, ev_txid from pgque.event where ev_part >= $1 and ev_part < $2'
           || ' and (ev_owner is null or ev_owner = $5)'
           || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '');
    -- The running transactions are probed one by one (each an equality on
    -- the index's ev_txid): "ev_txid = any(list) order by ev_txid" is no
    -- index range before PostgreSQL 17, and would scan the slot's whole
    -- index in order.
    execute 'select ev_id, ev_time from ('
         || '(' || v_from || ' and ev_txid >= $3 order by ev_txid limit 1)'
         || ' union all (select e.ev_id, e.ev_time, e.ev_txid from pg_catalog.unnest($4) x(xid)'
         || ' cross join lateral (' || v_from || ' and ev_txid = x.xid limit 1) e)'
         || ') h order by ev_txid limit 1'
       into o_ev_id, o_time
      using pgque._part_lo(s.sub_queue), pgque._part_hi(s.sub_queue), pg_snapshot_xmax(v_snap),
            array(select pg_snapshot_xip(v_snap)), s.sub_id;
end;
$$;

-- slot_heads(queue, consumer): per slot of a consumer, the first pending
-- event in ev_txid order and its age (NULL when the slot is caught up).
-- Cheap whatever the backlog (two index probes per slot), so the worker
-- pool reads it on every claim pass to claim the most behind free slot
-- first. Reads slot_group, slot_lease, subscription, tick, event.
create or replace function pgque.slot_heads(i_queue text, i_consumer text)
returns table (slot integer, head_ev_id bigint, head_age interval)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_nslots integer;
    -- One clock reading for every slot, so that ages compare exactly.
    v_now    timestamptz := clock_timestamp();
begin
    perform pgque._authorize_read(i_queue);
    select g.sg_nslots into v_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    return query
    select sl.sl_slot, h.o_ev_id, v_now - h.o_time
      from pgque._key_slots(i_queue, i_consumer, null) sl
     cross join lateral pgque._slot_head(sl.sl_sub, sl.sl_slot, v_nslots) h
     order by sl.sl_slot;
end;
$$;
