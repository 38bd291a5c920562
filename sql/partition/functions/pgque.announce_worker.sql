-- announce_worker(queue, consumer, worker, hungry, slots): records that
-- worker of the partitioned consumer is alive, works slots and is (or is
-- not) hungry, forgets the consumer's workers not heard from for 10
-- minutes, and returns the other workers heard from within max_age with
-- how long ago. The consumer must have slots (PQ034); worker is 1 to 200
-- bytes and slots at most 1024 entries (PQ011).
-- Tables: worker_presence (upsert, delete).
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
    v_age := pgque._check_interval('max age', coalesce(i_max_age, interval '10 minutes'), interval '0', interval '10 minutes');
    if not exists (select 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer) then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    insert into pgque.worker_presence as p (wp_queue, wp_consumer, wp_worker, wp_hungry, wp_slots, wp_seen)
    values (q.queue_id, i_consumer, i_worker, i_hungry, i_slots, v_now)
    on conflict (wp_queue, wp_consumer, wp_worker) do update
       set wp_hungry = excluded.wp_hungry, wp_slots = excluded.wp_slots, wp_seen = excluded.wp_seen;
    delete from pgque.worker_presence p
     where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer and p.wp_seen < v_now - interval '10 minutes';
    return query
        select p.wp_worker, p.wp_hungry, p.wp_slots, v_now - p.wp_seen
          from pgque.worker_presence p
         where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer
           and p.wp_worker <> i_worker and p.wp_seen >= v_now - v_age
         order by p.wp_worker;
end;
$$;
