-- announce_worker(queue, consumer, worker, hungry, slots, max_age): records
-- that worker of the partitioned consumer is alive, works slots and is (or
-- is not) hungry, and returns the other workers heard from within max_age
-- (1 ms to 10 minutes, PQ011; NULL is 10 minutes), each with its newest
-- announcement and how long ago it was made. The consumer must have slots
-- (PQ034); worker is 1 to 200 bytes and slots at most 1024 entries
-- (PQ011). Workers not heard from for 10 minutes are forgotten by the next
-- presence flip.
-- Tables: worker_presence (insert, read), slot_group (read).
create or replace function pgque.announce_worker(i_queue text, i_consumer text, i_worker text, i_hungry boolean,
                                                 i_slots integer[], i_max_age interval)
returns table (worker text, hungry boolean, slots integer[], age interval)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue := pgque._queue(i_queue);
    v_now timestamptz := clock_timestamp();
    v_age interval;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_consumer(i_consumer);
    if i_worker is null or i_hungry is null or i_slots is null then
        raise exception using errcode = '22004', message = 'worker, hungry and slots must not be NULL';
    end if;
    if i_worker = '' or octet_length(i_worker) > 200 then
        raise exception using errcode = 'PQ011',
            message = format('worker id must be 1 to 200 bytes, not %s', octet_length(i_worker));
    end if;
    if cardinality(i_slots) > 1024 then
        raise exception using errcode = 'PQ011', message = format('at most 1024 slots, not %s', cardinality(i_slots));
    end if;
    -- Peers read these back as this worker's slots: a list, of slot
    -- numbers any N could have (the worker's N may be an older one's while
    -- the group is resized).
    if array_ndims(i_slots) > 1 or array_position(i_slots, null) is not null
       or exists (select 1 from unnest(i_slots) s where s < 0 or s > 1023) then
        raise exception using errcode = 'PQ011',
            message = 'slots must be a one-dimensional list of slot numbers from 0 to 1023';
    end if;
    -- A max age of 0 would return no peer at all, and a worker trusting the
    -- answer would take every slot for its own.
    v_age := pgque._check_interval('max age', coalesce(i_max_age, interval '10 minutes'), interval '1 millisecond', interval '10 minutes');
    if not exists (select 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer) then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    insert into pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_hungry, wp_slots, wp_seen)
    values (q.queue_id, i_consumer, i_worker, i_hungry, i_slots, v_now);
    -- The consumer's distinct workers by a skip scan of the index (one probe
    -- per worker, however many records each has), then each one's newest
    -- record.
    return query
        with recursive w (wid) as (
            (select p.wp_worker from pgque.worker_presence p
              where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer
              order by p.wp_worker limit 1)
            union all
            select (select p.wp_worker from pgque.worker_presence p
                     where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer and p.wp_worker > w.wid
                     order by p.wp_worker limit 1)
              from w where w.wid is not null
        )
        select r.wp_worker, r.wp_hungry, r.wp_slots, v_now - r.wp_seen
          from w
         cross join lateral (select p.* from pgque.worker_presence p
                              where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer and p.wp_worker = w.wid
                              order by p.wp_seen desc limit 1) r
         where w.wid is not null and w.wid <> i_worker and r.wp_seen >= v_now - v_age
         order by r.wp_worker;
end;
$$;

-- _presence_keep(gen): the newest record of every worker heard from in the
-- last 10 minutes whose consumer still has slots, when it lives in
-- partition gen.
create or replace function pgque._presence_keep(i_gen integer)
returns setof pgque.worker_presence language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select distinct on (p.wp_queue, p.wp_consumer, p.wp_worker) p.*
      from pgque.worker_presence p
     where p.wp_seen >= clock_timestamp() - interval '10 minutes'
       and exists (select 1 from pgque.slot_group g where g.sg_queue = p.wp_queue and g.sg_consumer = p.wp_consumer)
     order by p.wp_queue, p.wp_consumer, p.wp_worker, p.wp_seen desc
$$;

-- _presence_flip(): retires the current presence generation, keeping each
-- live worker's newest record (see structure/presence.sql). Skipped when
-- the current generation holds nothing else. Waits at most 200 ms for the
-- retired partition's lock and otherwise tries again at the next maint().
-- Returns 1 when flipped. Not granted: maint() calls it as a layer hook.
-- Tables: presence_rotation (lock), worker_presence (insert, truncate).
create or replace function pgque._presence_flip()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur integer;
begin
    perform 1 from pgque.presence_rotation for update skip locked;
    if not found then
        return 0;
    end if;
    v_cur := pgque._presence_gen();
    if (select count(*) from pgque.worker_presence where wp_gen = v_cur)
       <= (select count(*) from pgque._presence_keep(v_cur) k where k.wp_gen = v_cur) then
        return 0;
    end if;
    if not pgque._flip_lock('pgque.worker_presence_' || v_cur) then
        return 0;
    end if;
    perform nextval('pgque.presence_gen_seq');
    insert into pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_hungry, wp_slots, wp_seen, wp_gen)
    select k.wp_queue, k.wp_consumer, k.wp_worker, k.wp_hungry, k.wp_slots, k.wp_seen, 1 - v_cur
      from pgque._presence_keep(v_cur) k
     where k.wp_gen = v_cur;
    execute format('truncate %s', 'pgque.worker_presence_' || v_cur);
    return 1;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'presence_flip', 'pgque._presence_flip()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;
