-- rotation_blockers(): what keeps maint() from rotating each queue's event
-- tables, for the operator to act on. Rotation reclaims space only when no
-- subscription still needs the oldest table, so a consumer that stopped
-- consuming (a forgotten subscription, perhaps a reader's) pins it forever,
-- and a transaction left open after subscribing (which holds a key-share
-- lock on the queue row) makes maint() skip the queue while it lasts.
-- Nothing here is dropped automatically: that would lose events a consumer
-- was promised. The remedies are unregister_consumer / unsubscribe (admin)
-- for a subscription and pg_terminate_backend(pid) for a session.
--
-- A layer can also hold the oldest table for a while after its last write
-- (the dedup keys in it are within their window); that passes by itself.
--
-- Returns one row per blocker: queue, kind ('subscription', 'session' or
-- 'retention'), what (the subscription's name; the session's pid, role and
-- application; what the layer keeps and until when), and since (the
-- subscription's last batch time, the start of the session's transaction,
-- or when the held table stopped being written). Only queues whose rotation is due
-- (rotation_period passed) are listed. Tables: queue, subscription, tick;
-- pg_locks, pg_stat_activity; and what the 'rotate' hooks read.
create or replace function pgque.rotation_blockers()
returns table (queue text, kind text, what text, since timestamptz)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    with due as (
        select q.* from pgque.queue q
         where clock_timestamp() - q.queue_switch_time >= q.queue_rotation_period
    )
    select d.queue_name, 'subscription', s.sub_name, t.tick_time
      from due d
      join pgque.subscription s on s.sub_queue = d.queue_id
      join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = s.sub_last_tick
     where t.tick_time < d.queue_switch_time
    union all
    select d.queue_name, 'session',
           format('pid %s, role %s, application %L, %s', a.pid, a.usename, a.application_name, a.state),
           a.xact_start
      from due d
      cross join pg_locks l
      join pg_stat_activity a on a.pid = l.pid
     where l.locktype = 'relation' and l.relation = 'pgque.queue'::regclass and l.granted
       and l.mode = 'RowShareLock' and a.pid <> pg_backend_pid()
       and a.state in ('idle in transaction', 'idle in transaction (aborted)')
    union all
    select d.queue_name, 'retention', h.why, d.queue_retired[(d.queue_cur_table + 1) % d.queue_ntables + 1]
      from due d
      cross join lateral (select pgque._rotate_hold(d.queue_id, (d.queue_cur_table + 1) % d.queue_ntables) as why) h
     where h.why is not null
    order by 1, 2, 4;
$$;
