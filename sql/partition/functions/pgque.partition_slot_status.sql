-- _slot_pending(sub_id, slot, nslots): events of one slot committed after
-- its cursor (pending, including retried copies owned by it) and not yet
-- acknowledged, and the age of the oldest. The cursor stays at the open
-- batch's first tick until the batch's last chunk is acknowledged, and a
-- catch-up batch can hold a slot's whole backlog ("Large batches"), so the
-- events of its chunks acknowledged so far (in the batch, that is visible
-- in its last tick's snapshot, and at or before st_acked_to: chunks go in
-- ev_id order) are left out. They were handled, or moved to the retry
-- queue or deferred, which _slot_held counts, as it counts the events the
-- receive of the chunk out now deferred behind a held key: those are left
-- out too (one probe of deferred's key for each event of that chunk). An
-- event with a lower ev_id
-- whose transaction committed after the batch's last tick is in a later
-- batch, and pending. The slot predicate is _slot_filter's, so the routing
-- index answers it: the cost is the slot's own backlog, not the stream's.
-- SECURITY DEFINER and granted, because the view below calls it with the
-- caller's privileges.
create or replace function pgque._slot_pending(i_sub integer, i_slot integer, i_nslots integer,
                                               out o_lag bigint, out o_oldest interval)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.subscription;
    st     pgque.sub_state;
    v_snap pg_snapshot;
    v_next pg_snapshot;
begin
    -- Callable directly by every pgque role: validate what goes into the
    -- statement text (a NULL slot or N would make it a syntax error, N = 0
    -- a division by zero).
    perform pgque._check_slot(i_slot, i_nslots);
    select * into s from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    -- The lag of a confined queue's subscription is the queue's to tell
    -- (the views below leave its rows out before they get here).
    if not pgque._may_read(s.sub_queue) then
        perform pgque._authorize_id(s.sub_queue, 'consume');
    end if;
    st := pgque._sub_state(i_sub);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = st.st_last_tick;
    if st.st_batch is not null then
        select tick_snapshot into v_next from pgque.tick where tick_queue = s.sub_queue and tick_id = st.st_next_tick;
    end if;
    -- Of the open batch (visible in $6), only what is past the acknowledged
    -- chunks ($7) and not deferred by the receive of the chunk out now (up
    -- to $8) behind a held key: _slot_held counts those.
    execute 'select count(*), pg_catalog.clock_timestamp() - min(ev_time) from pgque.event e'
         || ' where ev_part >= $1 and ev_part < $2 and ev_txid >= $3'
         || ' and not pg_catalog.pg_visible_in_snapshot(ev_txid, $4)'
         || ' and (ev_owner is null or ev_owner = $5)'
         || ' and ($6::pg_catalog.pg_snapshot is null or not pg_catalog.pg_visible_in_snapshot(ev_txid, $6)'
         || ' or (ev_id > $7 and not (ev_id <= $8 and exists (select from pgque.deferred d'
         || ' where d.ev_owner = $5 and d.ev_id = e.ev_id))))'
         || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '')
       into o_lag, o_oldest
      using pgque._part_lo(s.sub_queue), pgque._part_hi(s.sub_queue), pg_snapshot_xmin(v_snap), v_snap, s.sub_id,
            v_next, coalesce(st.st_acked_to, -1), coalesce(st.st_delivered_to, -1);
end;
$$;

-- _slot_held(sub_id): what a slot holds back behind its cursor: events
-- waiting for a retry (under pause, a blocked key's failed head), events
-- deferred behind a held key (a blocked key's later events, or those of a
-- key its lanes still run), the age of the oldest of them, and the number
-- of keys blocked under pause. The cursor moves on past all of them, so
-- _slot_pending does not see them, yet they are the slot's backlog: a slot
-- with a blocked tenant is not idle. (_slot_pending leaves out the
-- acknowledged chunks of the open batch, so an event deferred or retried
-- is counted twice only until its chunk is acknowledged.) Counts and
-- an age only, no key or data; refused (42501) for a confined queue the
-- caller may not read. A held key's events stay in deferred until its lane
-- settles them, so those a transactional handler has completed already
-- (event_done) are not counted: in a catch-up with hot keys held for
-- minutes they were most of the lag. (A plain handler's progress reaches
-- the server only at the settle.) SECURITY DEFINER and granted, as
-- _slot_pending. Tables: reads retry_queue, deferred, key_block (each by
-- its owner's primary key), event_done (by its key).
create or replace function pgque._slot_held(i_sub integer, out o_held bigint, out o_retrying bigint,
                                            out o_oldest interval, out o_blocked integer)
language plpgsql stable security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_queue integer;
begin
    select sub_queue into v_queue from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    -- A confined queue's counts are the queue's to tell, as _slot_pending's.
    if not pgque._may_read(v_queue) then
        perform pgque._authorize_id(v_queue, 'consume');
    end if;
    select d.n, r.n, clock_timestamp() - least(d.oldest, r.oldest), b.n
      into o_held, o_retrying, o_oldest, o_blocked
      from (select count(*) as n, min(de.ev_time) as oldest from pgque.deferred de
             where de.ev_owner = i_sub
               and not exists (select from pgque.event_done dn where dn.dn_sub = i_sub and dn.dn_ev_id = de.ev_id)) d,
           (select count(*) as n, min(ev_time) as oldest from pgque.retry_queue where ev_owner = i_sub) r,
           (select count(*)::integer as n from pgque.key_block
             where kb_sub = i_sub and kb_state in ('blocked', 'releasing')) b;
end;
$$;

-- The three slot views show a confined queue's slots only to whoever may
-- read it (_may_read, sql/engine/functions/pgque.authorize.sql): the rows
-- of other queues are left out, as they are for a role without the grant.

-- partition_slot_status: one row per slot: its lease (owner is NULL once the
-- lease expired), epoch, lag (the events of that slot, not of the whole
-- stream, still to be handled: those after its cursor and those it holds
-- back, see _slot_held) and the age of the oldest of them; held (events
-- deferred behind a held key), retrying (events waiting for their retry)
-- and blocked_keys (keys blocked under pause) say how much of it waits on
-- a failed head rather than on the worker.
select pgque._create_view('partition_slot_status', $ddl$
create or replace view pgque.partition_slot_status with (security_barrier) as
select q.queue_name      as queue,
       l.sl_consumer     as consumer,
       l.sl_slot         as slot,
       g.sg_nslots       as nslots,
       case when greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp() then l.sl_owner end as owner,
       case when l.sl_owner is not null then greatest(l.sl_until, st.st_time + l.sl_ttl) end as lease_until,
       l.sl_epoch        as epoch,
       p.o_lag + h.o_held + h.o_retrying as lag,
       case when p.o_oldest is null or h.o_oldest > p.o_oldest then h.o_oldest else p.o_oldest end as oldest_pending_age,
       g.sg_policy       as policy,
       case when st.st_sub is not null then st.st_batch else s.sub_batch end as open_batch,
       clock_timestamp() - coalesce(st.st_time, s.sub_active) as last_active,
       h.o_held          as held,
       h.o_blocked       as blocked_keys,
       h.o_retrying      as retrying
  from pgque.slot_lease l
  join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
  join pgque.queue q on q.queue_id = l.sl_queue
  join pgque.subscription s on s.sub_id = l.sl_sub
  left join lateral (select x.st_sub, x.st_batch, x.st_time from pgque.sub_state x
                      where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
  cross join lateral pgque._slot_pending(l.sl_sub, l.sl_slot, g.sg_nslots) p
  cross join lateral pgque._slot_held(l.sl_sub) h
 where pgque._may_read(l.sl_queue)
$ddl$);

-- partition_slot_leases: the slots and their leases only, without the lag
-- (which costs a read of each slot's backlog): cheap enough to poll.
-- holder_gone: the lease is bound to its holder's session and that session
-- is no backend any more (slot_lease.sql, "Dead holders"): a claim will
-- take the slot over before lease_until, so a claim loop should try it.
select pgque._create_view('partition_slot_leases', $ddl$
create or replace view pgque.partition_slot_leases with (security_barrier) as
select q.queue_name  as queue,
       l.sl_consumer as consumer,
       l.sl_slot     as slot,
       g.sg_nslots   as nslots,
       case when greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp() then l.sl_owner end as owner,
       case when l.sl_owner is not null then greatest(l.sl_until, st.st_time + l.sl_ttl) end as lease_until,
       l.sl_epoch    as epoch,
       g.sg_policy   as policy,
       coalesce(l.sl_owner is not null and l.sl_session is not null and pgque._session_gone(l.sl_session), false) as holder_gone
  from pgque.slot_lease l
  join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
  join pgque.queue q on q.queue_id = l.sl_queue
  left join lateral (select x.st_time from pgque.sub_state x
                      where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
 where pgque._may_read(l.sl_queue)
$ddl$);
