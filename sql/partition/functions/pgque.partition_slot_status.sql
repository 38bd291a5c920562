-- _slot_pending(sub_id, slot, nslots): events of one slot committed after
-- its cursor (pending, including retried copies owned by it) and the age of
-- the oldest. The slot predicate is _slot_filter's, so the routing index
-- answers it: the cost is the slot's own backlog, not the stream's.
-- SECURITY DEFINER and granted, because the view below calls it with the
-- caller's privileges.
create or replace function pgque._slot_pending(i_sub integer, i_slot integer, i_nslots integer,
                                               out o_lag bigint, out o_oldest interval)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.subscription;
    v_snap pg_snapshot;
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
    s := pgque._with_state(s);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    execute 'select count(*), pg_catalog.clock_timestamp() - min(ev_time) from pgque.event'
         || ' where ev_part >= $1 and ev_part < $2 and ev_txid >= $3'
         || ' and not pg_catalog.pg_visible_in_snapshot(ev_txid, $4)'
         || ' and (ev_owner is null or ev_owner = $5)'
         || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '')
       into o_lag, o_oldest
      using s.sub_queue * 16, s.sub_queue * 16 + 16, pg_snapshot_xmin(v_snap), v_snap, s.sub_id;
end;
$$;

-- The three slot views show a confined queue's slots only to whoever may
-- read it (_may_read, sql/engine/functions/pgque.authorize.sql): the rows
-- of other queues are left out, as they are for a role without the grant.

-- partition_slot_status: one row per slot: its lease (owner is NULL once the
-- lease expired), epoch, lag (pending events of that slot, not of the whole
-- stream) and the age of its oldest pending event.
select pgque._create_view('partition_slot_status', $ddl$
create or replace view pgque.partition_slot_status as
select q.queue_name      as queue,
       l.sl_consumer     as consumer,
       l.sl_slot         as slot,
       g.sg_nslots       as nslots,
       case when greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp() then l.sl_owner end as owner,
       case when l.sl_owner is not null then greatest(l.sl_until, st.st_time + l.sl_ttl) end as lease_until,
       l.sl_epoch        as epoch,
       p.o_lag           as lag,
       p.o_oldest        as oldest_pending_age,
       g.sg_policy       as policy,
       case when st.st_sub is not null then st.st_batch else s.sub_batch end as open_batch,
       clock_timestamp() - coalesce(st.st_time, s.sub_active) as last_active
  from pgque.slot_lease l
  join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
  join pgque.queue q on q.queue_id = l.sl_queue
  join pgque.subscription s on s.sub_id = l.sl_sub
  left join lateral (select x.st_sub, x.st_batch, x.st_time from pgque.sub_state x
                      where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
  cross join lateral pgque._slot_pending(l.sl_sub, l.sl_slot, g.sg_nslots) p
 where pgque._may_read(l.sl_queue)
$ddl$);

-- partition_slot_leases: the slots and their leases only, without the lag
-- (which costs a read of each slot's backlog): cheap enough to poll.
select pgque._create_view('partition_slot_leases', $ddl$
create or replace view pgque.partition_slot_leases as
select q.queue_name  as queue,
       l.sl_consumer as consumer,
       l.sl_slot     as slot,
       g.sg_nslots   as nslots,
       case when greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp() then l.sl_owner end as owner,
       case when l.sl_owner is not null then greatest(l.sl_until, st.st_time + l.sl_ttl) end as lease_until,
       l.sl_epoch    as epoch,
       g.sg_policy   as policy
  from pgque.slot_lease l
  join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
  join pgque.queue q on q.queue_id = l.sl_queue
  left join lateral (select x.st_time from pgque.sub_state x
                      where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
 where pgque._may_read(l.sl_queue)
$ddl$);
