-- Stalled slots.
--
-- A slot that is subscribed but not worked pins rotation for its whole
-- queue: its cursor holds the oldest event table, and its lag grows. It
-- happens when no live worker claims the slot (every worker is down, or a
-- claim was taken by something that is not a pool and then forgotten) or
-- when the owner keeps its lease alive but stopped consuming (a poll loop
-- stuck on a call, a handler that never returns).
--
-- partition_slot_stalls tells these apart from slow or idle slots with
-- index probes only, whatever the backlog:
--   behind_since   when the slot first had something to consume that it
--                  has not consumed: the time of the first tick after its
--                  cursor (NULL when the cursor is at the queue's newest
--                  tick: nothing to do, nothing pinned)
--   last_progress  when the slot's delivery state last moved (a batch
--                  opened or finished, a chunk handed out or acknowledged);
--                  lease renewals do not count (sub_state.st_moved)
--   stalled_since  the later of the two, while the slot is behind: how long
--                  it has been behind without moving
-- A slot is stalled when stalled_since is older than stall_after: twice
-- the lease ttl (one minute for a slot never claimed). That is past the
-- point where a live pool takes a dead worker's slot over (one ttl, then a
-- claim pass), so 'unclaimed' or 'lease expired' means no live pool with
-- room; a pool whose own loop on the slot is stuck gives it up a little
-- later, at twice the ttl and at least a minute (its watchdog,
-- docs/worker-pool.md). reason says what to do (docs/operations.md):
--   'unclaimed'        nobody holds the lease: no live worker
--   'lease expired'    the last owner stopped renewing and nobody took
--                      over: no live worker
--   'not progressing'  the owner renews its lease but does not consume
-- A healthy slot, however far behind, moves at every chunk, and an idle
-- one is not behind. Rows of queues the caller may not read are left
-- out (_may_read). Tables (read): slot_lease, slot_group, queue,
-- sub_state, tick.
select pgque._create_view('partition_slot_stalls', $ddl$
create or replace view pgque.partition_slot_stalls with (security_barrier) as
select v.queue, v.consumer, v.slot, v.nslots, v.owner, v.lease_live,
       v.behind_since, v.last_progress, v.stall_after,
       case when v.behind_since is not null then greatest(v.behind_since, v.last_progress) end as stalled_since,
       coalesce(greatest(v.behind_since, v.last_progress) < v.checked_at - v.stall_after
                and v.behind_since is not null, false) as stalled,
       case when not coalesce(greatest(v.behind_since, v.last_progress) < v.checked_at - v.stall_after
                              and v.behind_since is not null, false) then null
            when v.raw_owner is null then 'unclaimed'
            when not v.lease_live then 'lease expired'
            else 'not progressing' end as reason
  from (select q.queue_name                          as queue,
               l.sl_consumer                         as consumer,
               l.sl_slot                             as slot,
               g.sg_nslots                           as nslots,
               l.sl_owner                            as raw_owner,
               case when coalesce(greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp(), false)
                    then l.sl_owner end              as owner,
               l.sl_owner is not null
                 and coalesce(greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp(), false) as lease_live,
               nt.tick_time                          as behind_since,
               coalesce(st.st_moved, st.st_time)     as last_progress,
               coalesce(2 * l.sl_ttl, interval '1 minute') as stall_after,
               clock_timestamp()                     as checked_at
          from pgque.slot_lease l
          join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
          join pgque.queue q on q.queue_id = l.sl_queue
          left join lateral (select x.st_time, x.st_moved, x.st_last_tick from pgque.sub_state x
                              where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
          left join lateral (select t.tick_time from pgque.tick t
                              where t.tick_queue = l.sl_queue and t.tick_id > st.st_last_tick
                              order by t.tick_id limit 1) nt on true
         where pgque._may_read(l.sl_queue)) v
$ddl$);
