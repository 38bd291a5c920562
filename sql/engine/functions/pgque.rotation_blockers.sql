-- rotation_blockers(): what keeps maint() from rotating each queue's event
-- tables or from flipping the tick and state partitions, for the operator
-- to act on. Rotation reclaims space only when no subscription still needs
-- the oldest table, so a consumer that stopped consuming (a forgotten
-- subscription, perhaps a reader's) pins it forever. A truncation also
-- needs its table to itself: any session that read the oldest event table,
-- or the current tick or sub_state partition (every monitoring function
-- does), holds a lock on it until its transaction ends, and a transaction
-- left open after subscribing (which holds a key-share lock on the queue
-- row) makes maint() skip the queue while it lasts.
-- Nothing here is dropped automatically: that would lose events a consumer
-- was promised. The remedies are unregister_consumer / unsubscribe (admin)
-- for a subscription and pg_terminate_backend(pid) for a session.
--
-- A layer can also hold the oldest table for a while after its last write
-- (the dedup keys in it are within their window); that passes by itself.
--
-- Returns one row per blocker: queue (NULL for a flip), kind
-- ('subscription', 'session', 'flip' or 'retention'), what (the
-- subscription's name; the session's pid, role, application and state;
-- what the layer keeps and until when), since (the subscription's cursor
-- time, the start of the session's transaction, or when the held table
-- stopped being written), and for sessions pid, role and holds (the lock
-- and the table). Sessions are read from pg_locks, which every role sees
-- whole; their state and since come from pg_stat_activity, where another
-- role's session shows them only to members of pg_read_all_stats: without
-- it, state says so and since is NULL, and such a session is listed
-- whatever it is doing. Otherwise a session is listed when it is idle in
-- its transaction or has been in it for more than a second. Only queues
-- whose rotation is due (rotation_period passed) and flips with something
-- to drop are listed. The subscription check reads the oldest event
-- table: called in a transaction left open, this function holds it too.
-- Tables: queue, subscription, sub_state, tick, the oldest event tables;
-- pg_locks, pg_stat_activity; and what the 'rotate' hooks read.

-- _lock_holders(table, modes): the other sessions holding a granted lock
-- on table (in one of modes, or any when NULL) that are worth naming (see
-- above): pid (NULL for a prepared transaction), role, state, the start of
-- the transaction, and what it holds.
create or replace function pgque._lock_holders(i_table regclass, i_modes text[] default null)
returns table (pid integer, role text, what text, since timestamptz, holds text)
language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select l.pid, a.usename::text,
           case when l.pid is null then format('prepared transaction %s', l.virtualtransaction)
                else format('pid %s, role %s, application %L, %s', l.pid, a.usename, a.application_name,
                            coalesce(a.state, 'state not visible (grant pg_read_all_stats to the pgque owner)')) end,
           a.xact_start, format('%s on %s', l.mode, i_table)
      from pg_catalog.pg_locks l
      left join pg_catalog.pg_stat_activity a on a.pid = l.pid
     where l.locktype = 'relation' and l.relation = i_table and l.granted
       and l.database = (select d.oid from pg_catalog.pg_database d where d.datname = pg_catalog.current_database())
       and l.pid is distinct from pg_catalog.pg_backend_pid()
       and (i_modes is null or l.mode = any (i_modes))
       and (a.state is null or a.state like 'idle in transaction%'
            or a.xact_start < pg_catalog.clock_timestamp() - interval '1 second')
$$;

do $drop$
begin
    -- Earlier versions returned four columns: a new result type needs the
    -- old function gone (grants.sql grants the new one again).
    if exists (select 1 from pg_catalog.pg_proc
                where oid = to_regprocedure('pgque.rotation_blockers()')
                  and not ('pid' = any (proargnames))) then
        drop function pgque.rotation_blockers();
    end if;
end
$drop$;

create or replace function pgque.rotation_blockers()
returns table (queue text, kind text, what text, since timestamptz, pid integer, role text, holds text)
language sql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
    with due as (
        select q.*, (q.queue_cur_table + 1) % q.queue_ntables as next_table
          from pgque.queue q
         where clock_timestamp() - q.queue_switch_time >= q.queue_rotation_period
    )
    select d.queue_name, 'subscription', s.sub_name, t.tick_time, null::integer, null::text, null::text
      from due d
      cross join lateral pgque._rotate_pinners(d.queue_id, d.next_table) s
      cross join lateral pgque._sub_state(s.sub_id) st
      join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = st.st_last_tick
    union all
    select d.queue_name, 'session', h.what, h.since, h.pid, h.role, h.holds
      from due d
      cross join lateral pgque._lock_holders(pgque._event_table(d.queue_id, d.next_table)::regclass) h
    union all
    select d.queue_name, 'session', h.what, h.since, h.pid, h.role, h.holds || ' (a row lock, as a subscription being registered takes)'
      from due d
      cross join lateral pgque._lock_holders('pgque.queue'::regclass, array['RowShareLock']) h
    union all
    select null, 'flip', f.name || ' flip: ' || h.what, h.since, h.pid, h.role, h.holds
      from (select 'state' as name, format('pgque.sub_state_%s', pgque._gen('state')) as tbl
             where pgque._state_flip_due(pgque._gen('state'))
            union all
            select 'tick', format('pgque.tick_%s', pgque._gen('tick'))
             where pgque._tick_flip_due(pgque._gen('tick'))) f
      cross join lateral pgque._lock_holders(f.tbl::regclass) h
    union all
    select d.queue_name, 'retention', h.why, d.queue_retired[d.next_table + 1], null, null, null
      from due d
      cross join lateral (select pgque._rotate_hold(d.queue_id, d.next_table) as why) h
     where h.why is not null
    order by 1 nulls last, 2, 4;
$$;
