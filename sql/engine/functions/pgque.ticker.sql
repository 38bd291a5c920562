-- Ticks.
--
-- A tick records a queue position: pg_current_snapshot() and the event
-- sequence's value. A batch is the events committed between two ticks, so
-- tick snapshots of one queue must only move forward. The ticker therefore
-- locks the queue row first and takes the snapshot in a later statement
-- (a fresh READ COMMITTED snapshot, taken after any concurrent tick
-- committed), and refuses to run under REPEATABLE READ or SERIALIZABLE,
-- whose snapshot could predate the previous tick.

-- _probe_waits(): how many open transactions a skipped probe may wait on;
-- a tick with more is probed at every poll, as before.
create or replace function pgque._probe_waits()
returns integer language sql immutable
return 16;

-- _tick_waiting(note, queue, tick): whether the session's note
-- (pgque.probed_ticks, see _tick_due) says that the last probe of the
-- queue's tick found nothing and that every transaction it waits on still
-- runs: then no straggler can have committed since, and the probe is
-- skipped. Any session may set the name: an entry that is not a list of
-- transaction ids is no entry.
create or replace function pgque._tick_waiting(i_note text, i_queue integer, i_tick bigint)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_key  text := ',' || i_queue || ':' || i_tick || ':';
    v_at   integer := strpos(coalesce(i_note, ''), v_key);
    v_ids  text;
    v_snap pg_snapshot;
    v_wait xid8;
begin
    if v_at = 0 then
        return false;
    end if;
    v_ids := split_part(substr(i_note, v_at + length(v_key)), ',', 1);
    if v_ids !~ '^([0-9]{1,19}( [0-9]{1,19})*)?$' then
        return false;
    end if;
    v_snap := pg_current_snapshot();
    foreach v_wait in array string_to_array(v_ids, ' ')::xid8[] loop
        if pg_visible_in_snapshot(v_wait, v_snap) then
            return false; -- it ended: probe again
        end if;
    end loop;
    return true;
end;
$$;

-- _tick_running(tick snapshot, tick_xid): the transactions that tick did
-- not see finished below tick_xid (listed as running, or at or past its
-- xmax: a transaction has its id before snapshots list it) and that still
-- run now; NULL when over 1 000 ids lie between the xmax and tick_xid.
-- Called before a probe: any other such transaction ended before the
-- probe's snapshot, which sees what it committed. Ids of subtransactions
-- among them only cost an early probe. Its own function so that its plan
-- is made once a session, not at every probe (_tick_due plans each
-- statement at every call).
create or replace function pgque._tick_running(i_snap pg_snapshot, i_xid xid8)
returns xid8[] language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
as $$
declare
    v_now  pg_snapshot := pg_current_snapshot();
    v_xmax bigint := pg_snapshot_xmax(i_snap)::text::bigint;
    v_gap  bigint := i_xid::text::bigint - v_xmax;
begin
    if v_gap > 1000 then
        return null;
    end if;
    return array(select x from pg_snapshot_xip(i_snap) x
                  where x < i_xid and not pg_visible_in_snapshot(x, v_now)
                 union all
                 select (v_xmax + g)::text::xid8 from generate_series(0, v_gap - 1) g
                  where not pg_visible_in_snapshot((v_xmax + g)::text::xid8, v_now));
end;
$$;

-- _tick_due(queue, last tick, force): whether a tick is due: the event
-- count reached ticker_max_count, or events are pending and ticker_max_lag
-- passed, or ticker_idle_period passed.
--
-- "Events are pending" is first read from the event sequence. That misses a
-- producer that took its ev_id before the last tick but committed after it
-- (the sequence did not move since): a straggler. So when the sequence is
-- still, the index is asked whether any committed event is missing from the
-- last tick's snapshot: an event at or past its xmax, or of a transaction it
-- listed as running.
--
-- That probe is most of what polling an idle queue costs (it is planned on
-- every call), so a tick that can have no straggler left is not probed
-- again. Producers take their transaction id before their event ids, and
-- tick_xid was assigned after the ticker read the sequence the tick
-- records; so a straggler's transaction id is below tick_xid. When no
-- transaction below tick_xid is running (the snapshot's xmin is at or past
-- it) and the probe, under the same or a later snapshot, finds nothing, no
-- straggler of the tick can ever commit. The session remembers that tick as
-- settled (setting pgque.settled_ticks: ",queue_id:tick_id:event_seq:time,"
-- per queue, the tick's event sequence value and its time in microseconds
-- since the epoch) and
-- its later polls skip the probe. Transactions that hold no transaction id
-- (pg_dump, reports, standby feedback) do not hold a tick unsettled. The
-- memory is only a shortcut: a new session, or a tick without tick_xid,
-- probes as before, and a straggler the probe misses is still in the next
-- tick's batch, at the latest after ticker_idle_period.
--
-- A transaction below tick_xid that stays open (a report or a migration
-- that wrote something, a producer stuck before its insert) holds the tick
-- unsettled for as long as it runs, and the probe, planned at every call,
-- ran on every poll of every idle queue: with 30 idle queues and one such
-- transaction the ticker's backend spent 0.7 s of CPU a second. But only
-- a transaction below tick_xid that the tick did not see finished can
-- commit a straggler (_tick_running), and a probe that found nothing saw
-- every one of them that had ended. So the session also notes, per queue, the tick and those of them
-- still running when the probe found nothing (setting pgque.probed_ticks:
-- ",queue_id:tick_id:xid xid …,", up to _probe_waits() of them); later
-- polls skip the probe until one of them ends, then probe again. The
-- running set is read from a snapshot taken before the probe's, never from
-- the commit log, which marks a transaction committed before snapshots
-- stop listing it as running.
--
-- The probe is planned for the queue at hand every time (force_custom_plan,
-- as the automatic mode chose anyway): the automatic mode also plans the
-- statement once generically, at its sixth execution in a session, to
-- compare costs, and a generic plan of a query on pgque.event opens and
-- locks every partition of every queue. With 1 400 queues (12 600 event
-- tables and indexes) that one planning failed with "out of shared
-- memory", and so did every call that reached it.
--
-- A tick without tick_xid (its transaction had an id before it read the
-- sequence, as force_next_tick gives it, or the sequence moved between
-- the ticker's two reads, as it often does under load) has no bound below
-- which a straggler's transaction must lie, so no probe could settle it:
-- once its queue fell still, every poll probed it, planning the probe
-- each time (0.6 to 1 ms), until ticker_idle_period made the next tick,
-- a minute later by default. So when a tick written now would have a
-- tick_xid (bound: the calling transaction had no id when the sequence
-- was read), such a tick is due once ticker_max_lag has passed: one more
-- tick, an empty batch unless a straggler committed, and that one settles.
-- A caller whose transaction has an id could only write another tick
-- without tick_xid, and probes as before.
drop function if exists pgque._tick_due(pgque.queue, pgque.tick, boolean);
create or replace function pgque._tick_due(q pgque.queue, t pgque.tick, i_force boolean, i_bound boolean)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
    v_seq  bigint := coalesce(pg_sequence_last_value(q.queue_event_seq), 0);
    v_age  interval := clock_timestamp() - t.tick_time;
    v_mem  text;
    v_tag  text;
    v_open boolean;
    v_run  xid8[];
    v_note text;
begin
    if i_force or v_seq - t.tick_event_seq >= q.queue_ticker_max_count
       or v_age >= q.queue_ticker_idle_period then
        return true;
    end if;
    if v_age < q.queue_ticker_max_lag then
        return false;
    end if;
    if v_seq > t.tick_event_seq or (t.tick_xid is null and i_bound) then
        return true;
    end if;
    v_mem := coalesce(nullif(current_setting('pgque.settled_ticks', true), ''), ',');
    v_tag := q.queue_id || ':' || t.tick_id || ':';
    if t.tick_xid is not null and strpos(v_mem, ',' || v_tag) > 0 then
        return false;
    end if;
    -- Before the probe: a transaction below tick_xid that ends after this
    -- snapshot may still commit a straggler.
    v_open := t.tick_xid is null or pg_snapshot_xmin(pg_current_snapshot()) < t.tick_xid;
    if v_open and t.tick_xid is not null then
        -- The last probe of this tick found nothing: skip this one while
        -- every transaction that could still commit a straggler runs.
        v_note := current_setting('pgque.probed_ticks', true);
        if v_note is not null and pgque._tick_waiting(v_note, q.queue_id, t.tick_id) then
            return false;
        end if;
        v_run := pgque._tick_running(t.tick_snapshot, t.tick_xid);
    end if;
    if exists (
        select 1 from pgque.event e
         where e.ev_part >= pgque._part_lo(q.queue_id) and e.ev_part < pgque._part_hi(q.queue_id)
           and (e.ev_txid >= pg_snapshot_xmax(t.tick_snapshot)
                or e.ev_txid = any(array(select pg_snapshot_xip(t.tick_snapshot))))) then
        return true;
    end if;
    if not v_open then
        perform set_config('pgque.settled_ticks',
                           regexp_replace(v_mem, ',' || q.queue_id || ':[0-9:]+,', ',') || v_tag
                           || t.tick_event_seq || ':' || (extract(epoch from t.tick_time) * 1000000)::bigint || ',',
                           false);
    elsif t.tick_xid is not null and cardinality(v_run) <= pgque._probe_waits() then
        perform set_config('pgque.probed_ticks',
                           regexp_replace(coalesce(nullif(current_setting('pgque.probed_ticks', true), ''), ','),
                                          ',' || q.queue_id || ':[^,]*,', ',')
                           || q.queue_id || ':' || t.tick_id || ':' || array_to_string(v_run, ' ') || ',', false);
    end if;
    return false;
end;
$$;

-- _tick_isolation(): refuses a transaction whose snapshot could predate
-- the previous tick (REPEATABLE READ, SERIALIZABLE).
create or replace function pgque._tick_isolation()
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('the ticker must run in READ COMMITTED, not %s', current_setting('transaction_isolation'));
    end if;
end;
$$;

-- _tick_poll(queue_id, force): whether a tick of the queue is due, read
-- without locking, so polling idle queues writes nothing. Returns the event
-- sequence's value read before the check when one is due, NULL otherwise.
create or replace function pgque._tick_poll(i_queue_id integer, i_force boolean)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue;
    t     pgque.tick;
    v_seq bigint;
begin
    select * into q from pgque.queue where queue_id = i_queue_id;
    v_seq := coalesce(pg_sequence_last_value(q.queue_event_seq), 0);
    select * into t from pgque.tick where tick_queue = i_queue_id order by tick_id desc limit 1;
    if pgque._tick_due(q, t, i_force, pg_current_xact_id_if_assigned() is null) then
        return v_seq;
    end if;
    return null;
end;
$$;

-- _tick_write(queue_id, force, seq, bound): makes the tick _tick_poll (or
-- ticker()'s first statement) found due, unless a concurrent ticker made it
-- first, checking again under the queue's lock. seq is the event sequence
-- value that look read; bound says this transaction had no id then.
-- The row lock below assigns the id, so it is above every producer's that
-- holds an event id up to seq: the tick's tick_xid, when the sequence has
-- not moved by the time the tick is written (see _tick_due). Returns the
-- new tick id or NULL. Notifies channel "pgque" with the queue's tag, so
-- consumers can wake up at once, and runs the layers' 'tick' hooks
-- (pgque._tick_hooks).
create or replace function pgque._tick_write(i_queue_id integer, i_force boolean, i_seq bigint, i_bound boolean)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q      pgque.queue;
    t      pgque.tick;
    v_tick bigint;
    v_seq  bigint;
begin
    select * into q from pgque.queue where queue_id = i_queue_id for no key update;
    select * into t from pgque.tick where tick_queue = i_queue_id order by tick_id desc limit 1;
    if not pgque._tick_due(q, t, i_force, i_bound) then
        return null;
    end if;

    -- The tick's time is the transaction's start, as in PgQ: for the
    -- ticker daemon, the moment it polled. Polls come every tick interval
    -- (10 ms by default) and a tick is due when the last one is
    -- ticker_max_lag (10 ms) old, so a time stamped later in the call
    -- would make the next poll find it a fraction short of due, and ticks
    -- would come one poll in two.
    v_tick := nextval('pgque.tick_id_seq');
    v_seq := coalesce(pg_sequence_last_value(q.queue_event_seq), 0);
    insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_xid)
    values (i_queue_id, v_tick, now(), pg_current_snapshot(), v_seq,
            case when i_bound and v_seq = i_seq then pg_current_xact_id() end);
    perform pgque._tick_hooks(i_queue_id, v_tick);
    -- Notifications are queued at commit, and a full NOTIFY queue (a
    -- listener idle in a transaction, perhaps a stranger's: any role may
    -- LISTEN) would then fail the tick. Consumers poll anyway, so past
    -- half full (_notify_max_usage) the wake-up is skipped rather than the
    -- tick put at risk.
    if pg_notification_queue_usage() < pgque._notify_max_usage() then
        perform pg_notify('pgque', pgque._tick_tag(q.queue_name));
    end if;
    return v_tick;
end;
$$;

-- _tick(queue_id, force): makes a tick for one queue when one is due.
-- Returns the new tick id or NULL.
create or replace function pgque._tick(i_queue_id integer, i_force boolean)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_bound boolean := pg_current_xact_id_if_assigned() is null;
    v_seq   bigint;
begin
    perform pgque._tick_isolation();
    v_seq := pgque._tick_poll(i_queue_id, i_force);
    if v_seq is null then
        return null;
    end if;
    return pgque._tick_write(i_queue_id, i_force, v_seq, v_bound);
end;
$$;

-- ticker(queue): ticks one queue if a tick is due (event count reached
-- ticker_max_count, events pending for ticker_max_lag, or
-- ticker_idle_period passed), and always after force_next_tick(queue) in
-- the same transaction. Returns the tick id or NULL.
create or replace function pgque.ticker(i_queue text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q        pgque.queue := pgque._queue(i_queue);
    v_forced boolean;
    v_tick   bigint;
begin
    v_forced := pgque._tick_forced(q.queue_id);
    v_tick := pgque._tick(q.queue_id, v_forced);
    if v_forced then
        -- One forced tick per force_next_tick.
        perform set_config('pgque.forced_ticks',
                           replace(current_setting('pgque.forced_ticks', true), ',' || q.queue_id || ',', ''), true);
    end if;
    return v_tick;
end;
$$;

-- _ticker_probes(): how many queues one ticker() call may probe for
-- stragglers (see below). Inlined.
create or replace function pgque._ticker_probes()
returns integer language sql immutable
return 50;

-- ticker(): ticks every queue that is due. Returns how many were ticked.
--
-- A probe (_tick_due) locks the queue's three event tables and their six
-- indexes, held to the end of the call, beside the lock every queue's
-- sequence read takes. A session's first call probes every queue whose
-- last tick it has not settled, which is all of them, and the server's
-- lock table holds max_locks_per_transaction times max_connections locks
-- in all (6 400 by default, with some slack). With 1 400 queues that
-- first call failed with "out of shared memory" (53200), and so did every
-- call after it, since the settled ticks it would have noted were rolled
-- back with it: the ticker ticked nothing, and while it held its locks
-- other sessions could fail the same way. So one call probes at most
-- _ticker_probes() queues (450 locks) and notes where it stopped
-- (pgque.ticker_resume, a session setting); the next call starts there,
-- and a session's first pass over 1 400 queues takes 28 calls of about
-- 60 ms. Queues found due without a probe (count, idle period, or events
-- sent since their last tick) are ticked whatever the budget. What still
-- grows with the queues is the sequence reads: one lock a queue a call.
create or replace function pgque.ticker()
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_bound  boolean := pg_current_xact_id_if_assigned() is null;
    v_mem    text := coalesce(nullif(current_setting('pgque.settled_ticks', true), ''), ',');
    v_note   text := coalesce(nullif(current_setting('pgque.probed_ticks', true), ''), ',');
    v_resume integer;
    v_id     integer;
    v_tick   bigint;
    v_probe  boolean;
    v_probes integer := 0;
    v_stop   integer;
    v_seq    bigint;
    v_due    integer[] := '{}';
    v_seqs   bigint[] := '{}';
    v_n      bigint := 0;
begin
    perform pgque._tick_isolation();
    if v_mem !~ '^,([0-9]{1,9}:[0-9]{1,18}:[0-9]{1,18}:[0-9]{1,18},)*$' then
        v_mem := ',';
        perform set_config('pgque.settled_ticks', v_mem, false);
    end if;
    if v_note !~ '^,([0-9]{1,9}:[0-9]{1,18}:([0-9]{1,19}( [0-9]{1,19})*)?,)*$' then
        v_note := ',';
        perform set_config('pgque.probed_ticks', v_note, false);
    end if;
    -- The resume point is this function's own note, but any session may
    -- set the name: a value that is not a queue id means no resume point.
    v_resume := case when current_setting('pgque.ticker_resume', true) ~ '^[0-9]{1,9}$'
                     then current_setting('pgque.ticker_resume', true)::integer else 0 end;
    -- Every queue is polled before any is ticked: the first tick gives the
    -- transaction its id, and that id bounds the producers of every tick
    -- of this call only if all their sequences were read before it.
    --
    -- One statement first drops the queues _tick_due would certainly find
    -- not due: neither count nor idle period reached, and either the last
    -- tick younger than ticker_max_lag or the sequence still and the tick
    -- settled in this session. An idle queue then costs a row of it; one
    -- whose last probe waits on transactions that all still run
    -- (_tick_waiting) costs a call of that more.
    -- A row that is due by count, idle period or a moved sequence (or
    -- whose last tick has no tick_xid, see _tick_due) needs no probe, nor
    -- _tick_poll's second look: the sequence value read here, before this
    -- transaction has an id, is the one its tick is bounded by
    -- (_tick_write checks again under the queue's lock). The others count
    -- against the budget, from the queue after the one the last call
    -- stopped before. Each statement a tick skips is most of its cost: a
    -- tick every 10 ms, of a queue with traffic, makes this the common row.
    --
    -- The session's settled ticks are read once, as a set joined to the
    -- queues by id (m): looked up in the text for each queue, they made
    -- the statement quadratic in the number of queues (15 ms a call with
    -- 1 000 idle queues). A queue whose settled tick recorded the event
    -- sequence value read now, and whose idle period has not passed since
    -- that tick, is not due and needs no probe whatever its last tick is:
    -- a later tick (another session's) has the same sequence value, no
    -- event its snapshot could miss (every event up to that value was
    -- committed before the settled tick), and a later time. Its last tick
    -- is not read, which was most of an idle queue's cost. The subqueries
    -- s and k are kept apart (offset 0) so that the sequence is read once
    -- a queue and the tick's filter is a one-time test: as a filter on
    -- the index scan it ran on every tick of a busy queue. Any session
    -- may set the name: a memory that is not a list of such entries (or
    -- one an older version wrote) is dropped, and a time in the future is
    -- not trusted.
    --
    -- The probe notes (n, see _tick_due) are read the same way: a queue
    -- whose last probe found nothing and waits on transactions that all
    -- still run under this statement's snapshot is dropped here, without
    -- a probe and without counting against the budget. Asked in the loop
    -- below, one call a queue, with one open writer and 1 000 idle queues
    -- that cost 90 ms a poll.
    for v_id, v_probe, v_tick, v_seq in
        select q.queue_id,
               not (s.seq - t.tick_event_seq >= q.queue_ticker_max_count
                    or clock_timestamp() - t.tick_time >= q.queue_ticker_idle_period
                    or s.seq > t.tick_event_seq
                    or (t.tick_xid is null and v_bound)),
               t.tick_id, s.seq
          from pgque.queue q
          left join (select split_part(e, ':', 1)::integer as qid, split_part(e, ':', 2)::bigint as tick,
                            split_part(e, ':', 3)::bigint as seq,
                            timestamptz 'epoch' + split_part(e, ':', 4)::bigint * interval '1 microsecond' as at
                       from string_to_table(v_mem, ',') e where e <> '') m on m.qid = q.queue_id
          left join (select split_part(e, ':', 1)::integer as qid, split_part(e, ':', 2)::bigint as tick,
                            string_to_array(nullif(split_part(e, ':', 3), ''), ' ')::xid8[] as ids
                       from string_to_table(v_note, ',') e where e <> '') n on n.qid = q.queue_id
         cross join lateral (select coalesce(pg_sequence_last_value(q.queue_event_seq), 0) as seq offset 0) s
         cross join lateral (select m.seq = s.seq and q.queue_ticker_max_count > 0 and m.at <= clock_timestamp()
                                    and clock_timestamp() - m.at < q.queue_ticker_idle_period as still
                              offset 0) k
         cross join lateral (select t.tick_id, t.tick_time, t.tick_event_seq, t.tick_xid
                               from pgque.tick t
                              where t.tick_queue = q.queue_id and k.still is not true
                              order by t.tick_id desc limit 1) t
         where (s.seq - t.tick_event_seq >= q.queue_ticker_max_count
                or clock_timestamp() - t.tick_time >= q.queue_ticker_idle_period
                or (clock_timestamp() - t.tick_time >= q.queue_ticker_max_lag
                    and (s.seq > t.tick_event_seq or t.tick_xid is null or m.tick is distinct from t.tick_id)))
           and not (n.tick is not null and n.tick = t.tick_id
                    and not (s.seq - t.tick_event_seq >= q.queue_ticker_max_count
                             or clock_timestamp() - t.tick_time >= q.queue_ticker_idle_period
                             or s.seq > t.tick_event_seq)
                    and not exists (select from unnest(n.ids) x where pg_visible_in_snapshot(x, pg_current_snapshot())))
         order by q.queue_id <= v_resume, q.queue_id
    loop
        if v_probe then
            if v_probes >= pgque._ticker_probes() then
                v_stop := coalesce(v_stop, v_id);
                continue;
            end if;
            v_probes := v_probes + 1;
            v_seq := pgque._tick_poll(v_id, false);
        end if;
        if v_seq is not null then
            v_due := v_due || v_id;
            v_seqs := v_seqs || v_seq;
        end if;
    end loop;
    if v_stop is not null then
        perform set_config('pgque.ticker_resume', (v_stop - 1)::text, false);
    end if;
    for i in 1 .. cardinality(v_due) loop
        if pgque._tick_write(v_due[i], false, v_seqs[i], v_bound) is not null then
            v_n := v_n + 1;
        end if;
    end loop;
    return v_n;
end;
$$;

-- force_next_tick(queue): makes the next ticker call tick, as in PgQ, by
-- advancing the event sequence by ticker_max_count. A ticker daemon may
-- tick at the same moment and use that advance up, so the transaction also
-- remembers the queue (a transaction-local setting read by
-- _tick_forced): ticker(queue) later in the same transaction always
-- ticks. Returns the new sequence value.
create or replace function pgque.force_next_tick(i_queue text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    perform set_config('pgque.forced_ticks',
                       coalesce(nullif(current_setting('pgque.forced_ticks', true), ''), '') || ',' || q.queue_id || ',', true);
    return setval(q.queue_event_seq,
                  coalesce(pg_sequence_last_value(q.queue_event_seq), 0) + q.queue_ticker_max_count);
end;
$$;

-- _tick_tag(queue): the payload of a queue's tick notification on
-- channel pgque: 16 hex digits of sha256('tick:' || queue). Any role of
-- the cluster may LISTEN, so the payload does not spell the queue's name;
-- clients compute the same tag from the name they consume (Go:
-- workerpool.TickTag). A listener that guesses a name can confirm it: the
-- tag keeps names out of plain sight, it does not make them secret.
-- Touches no table. Inlined into the ticker's statement (no SET clause,
-- every name qualified; stable, as convert_to is).
create or replace function pgque._tick_tag(i_queue text)
returns text language sql stable
as $$
    select pg_catalog.encode(substring(pg_catalog.sha256(pg_catalog.convert_to('tick:' operator(pg_catalog.||) i_queue, 'UTF8'))
                                       from 1 for 8), 'hex')
$$;

-- _notify_max_usage(): the NOTIFY queue usage (0..1) from which ticks
-- skip their wake-up notification: 0.5, or less when the ticking session
-- sets pgque.notify_max_usage to a number between 0 and 0.5. The setting
-- can only make the skip start earlier (a session that lowers it only
-- makes its own ticks quieter); anything else (not a plain decimal,
-- or over 0.5) is ignored. The queue is 8 GB in a standard build, so tests
-- lower it to exercise the skip without filling gigabytes. Touches no
-- table. A SQL expression the planner inlines: the ticks and receives
-- that ask it make no function call.
create or replace function pgque._notify_max_usage()
returns double precision language sql stable
as $$
    select case when pg_catalog.current_setting('pgque.notify_max_usage', true)
                     operator(pg_catalog.~) '^\s*([0-9]{1,20}(\.[0-9]{0,20})?|\.[0-9]{1,20})\s*$'
                then case when pg_catalog.current_setting('pgque.notify_max_usage', true)::pg_catalog.float8
                               operator(pg_catalog.<=) 0.5
                          then pg_catalog.current_setting('pgque.notify_max_usage', true)::pg_catalog.float8
                          else 0.5 end
                else 0.5 end
$$;

-- _tick_forced(queue_id): whether force_next_tick(queue) ran earlier in
-- this transaction. The setting is only a hint for the admin's own
-- transaction: setting it by hand forces ticks, which force_next_tick
-- allows anyway, and only ticker(queue) (pgque_admin) reads it.
create or replace function pgque._tick_forced(i_queue_id integer)
returns boolean language sql stable
as $$
    select pg_catalog.strpos(coalesce(pg_catalog.current_setting('pgque.forced_ticks', true), ''),
                             ',' operator(pg_catalog.||) i_queue_id::pg_catalog.text operator(pg_catalog.||) ',')
           operator(pg_catalog.>) 0
$$;

-- _ticker_expiry(lease): when the ticker lease expires: the later of
-- the claim's expiry and the last renewal's (ticker_beat_seq, see
-- structure/tables.sql). Meaningless once the owner is NULL (free).
create or replace function pgque._ticker_expiry(l pgque.ticker_lease)
returns timestamptz language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select greatest(l.lease_until,
                    to_timestamp(pg_sequence_last_value('pgque.ticker_beat_seq'::regclass)::double precision / 1000))
$$;

-- ticker_lead(worker, ttl): leader election for ticker daemons. Returns
-- true when worker holds the single ticker lease (renewing it when less than
-- half of ttl is left, taking it over when free or expired). worker is 1 to
-- 200 bytes; ttl is 1 ms to 1 day of real time (PQ011). A renewal writes no
-- row version: it locks the row (which marks the tuple in place, and makes
-- a concurrent takeover wait and then see the renewal) and moves
-- ticker_beat_seq. Only a change of owner updates the row.
-- Tables: ticker_lease (lock; insert or update on a change of owner).
create or replace function pgque.ticker_lead(i_worker text, i_ttl interval)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l   pgque.ticker_lease;
    v_now timestamptz := clock_timestamp();
    v_ttl interval;
begin
    if i_worker is null or i_worker = '' or octet_length(i_worker) > 200 then
        raise exception using errcode = 'PQ011',
            message = format('ticker worker id must be 1 to 200 bytes, not %s', coalesce(octet_length(i_worker)::text, 'NULL'));
    end if;
    if i_ttl is null then
        raise exception using errcode = 'PQ011', message = 'ticker lease ttl must not be NULL';
    end if;
    -- Bounded on the real duration, so a lease cannot be taken for years
    -- with an interval that only compares as short.
    v_ttl := pgque._check_interval('ticker lease ttl', i_ttl, interval '1 millisecond', interval '1 day');
    -- The common case, a leader well within its lease, only reads.
    select * into l from pgque.ticker_lease;
    if found and l.owner = i_worker and pgque._ticker_expiry(l) - v_now > v_ttl / 2 then
        return true;
    end if;
    select * into l from pgque.ticker_lease for update;
    if found and l.owner = i_worker then
        -- A renewal (also of a lease that ran out while nobody took it).
        if coalesce(pgque._ticker_expiry(l) - v_now <= v_ttl / 2, true) then
            perform setval('pgque.ticker_beat_seq', (extract(epoch from v_now + v_ttl) * 1000)::bigint);
        end if;
        return true;
    end if;
    insert into pgque.ticker_lease as tl (singleton, owner, lease_until, epoch)
    values (true, i_worker, v_now + v_ttl, 1)
    on conflict (singleton) do update
       set owner = excluded.owner,
           lease_until = excluded.lease_until,
           epoch = tl.epoch + case when tl.owner is not distinct from excluded.owner then 0 else 1 end
     where tl.owner is null
        or greatest(tl.lease_until,
                    to_timestamp(pg_sequence_last_value('pgque.ticker_beat_seq'::regclass)::double precision / 1000)) < v_now;
    return found;
end;
$$;

-- ticker_resign(worker): gives the ticker lease up if worker holds it, and
-- then notifies channel pgque_ticker (delivered at commit) so that standing
-- tickers seek the lease at once instead of at their next lease check.
create or replace function pgque.ticker_resign(i_worker text)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    update pgque.ticker_lease set owner = null, lease_until = null where owner = i_worker;
    if found then
        perform pg_catalog.pg_notify('pgque_ticker', 'resigned');
    end if;
    return found;
end;
$$;
