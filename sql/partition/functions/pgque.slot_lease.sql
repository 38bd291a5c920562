-- Leases.
--
-- A slot is worked by the worker that holds its lease. claim_slot takes a
-- free or expired lease (epoch + 1) or renews one already held (same
-- epoch). Every receive/ack/nack on a slot first checks, under the lease
-- row's lock, that the caller is the owner: a worker whose lease was taken
-- over gets PQ032 and can neither receive nor ack. An expired lease that
-- nobody took over still belongs to its owner (grace rule), so a slow but
-- sole worker is not fenced for nothing. Leases are plain short
-- transactions: they work through transaction-mode poolers. Times come
-- from clock_timestamp(), not the transaction start.

-- _check_worker(worker): validates a worker id.
create or replace function pgque._check_worker(i_worker text)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_worker is null then
        raise exception using errcode = '22004', message = 'worker id must not be NULL';
    end if;
    if i_worker = '' or octet_length(i_worker) > 200 then
        raise exception using errcode = 'PQ011',
            message = format('worker id must be 1 to 200 bytes, not %s', octet_length(i_worker));
    end if;
end;
$$;

-- _lease(queue, consumer, slot): the slot's lease row, locked. PQ034 when
-- the slot is not subscribed; a NULL slot (22004) or one outside 0..N-1 of
-- the persisted N (PQ011) is an invalid argument, not a missing slot.
create or replace function pgque._lease(i_queue text, i_consumer text, i_slot integer)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    select l1.* into l from pgque.slot_lease l1 join pgque.queue q on q.queue_id = l1.sl_queue
     where q.queue_name = i_queue and l1.sl_consumer = i_consumer and l1.sl_slot = i_slot
       for update of l1;
    if not found then
        perform pgque._queue(i_queue);
        perform pgque._check_slot(i_slot, coalesce(
            (select g.sg_nslots from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
              where q.queue_name = i_queue and g.sg_consumer = i_consumer), 1024));
        raise exception using errcode = 'PQ034',
            message = format('slot %s of consumer %L on queue %L is not subscribed', i_slot, i_consumer, i_queue);
    end if;
    return l;
end;
$$;

-- claim_slot(queue, consumer, slot, worker, ttl): returns the lease's epoch
-- when worker now holds it, NULL when another live owner does.
create or replace function pgque.claim_slot(i_queue text, i_consumer text, i_slot integer, i_worker text,
                                            i_ttl interval default '30 seconds')
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l     pgque.slot_lease;
    v_now timestamptz := clock_timestamp();
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_worker(i_worker);
    if i_ttl is null or i_ttl <= interval '0' or i_ttl > interval '1 day' then
        raise exception using errcode = 'PQ011',
            message = format('lease ttl must be positive and at most 1 day, not %s', coalesce(i_ttl::text, 'NULL'));
    end if;
    if i_slot is null then
        raise exception using errcode = '22004', message = 'slot must not be NULL';
    end if;
    l := pgque._lease(i_queue, i_consumer, i_slot);
    if l.sl_owner = i_worker then
        update pgque.slot_lease set sl_until = v_now + i_ttl, sl_ttl = i_ttl
         where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
        return l.sl_epoch;
    end if;
    if l.sl_owner is not null and l.sl_until > v_now then
        return null;
    end if;
    update pgque.slot_lease
       set sl_owner = i_worker, sl_until = v_now + i_ttl, sl_ttl = i_ttl, sl_epoch = sl_epoch + 1
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
    return l.sl_epoch + 1;
end;
$$;

-- release_slot(queue, consumer, slot, worker): gives the lease up. Only the
-- owner can; returns true when released, false when worker did not hold it.
create or replace function pgque.release_slot(i_queue text, i_consumer text, i_slot integer, i_worker text)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_worker(i_worker);
    l := pgque._lease(i_queue, i_consumer, i_slot);
    if l.sl_owner is distinct from i_worker then
        return false;
    end if;
    update pgque.slot_lease set sl_owner = null, sl_until = null
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
    return true;
end;
$$;

-- _hold_lease(queue, consumer, slot, nslots, worker): the lease row, locked,
-- after checking N and that worker owns the lease (PQ032 otherwise).
-- Renews the lease when less than half of its ttl is left: the heartbeat
-- rides on the per-batch calls, at most two writes per ttl.
create or replace function pgque._hold_lease(i_queue text, i_consumer text, i_slot integer,
                                             i_nslots integer, i_worker text)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    l     pgque.slot_lease;
    v_now timestamptz;
begin
    perform pgque._check_worker(i_worker);
    perform pgque._check_slot(i_slot, i_nslots);
    perform pgque._slot_group(i_queue, i_consumer, i_nslots);
    l := pgque._lease(i_queue, i_consumer, i_slot);
    if l.sl_owner is distinct from i_worker then
        raise exception using errcode = 'PQ032',
            message = format('worker %L does not hold the lease on slot %s/%s of consumer %L (owner %s, epoch %s)',
                             i_worker, i_slot, i_nslots, i_consumer, coalesce(quote_literal(l.sl_owner), 'none'), l.sl_epoch);
    end if;
    v_now := clock_timestamp();
    if l.sl_until - v_now < l.sl_ttl / 2 then
        update pgque.slot_lease set sl_until = v_now + sl_ttl
         where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
        l.sl_until := v_now + l.sl_ttl;
    end if;
    return l;
end;
$$;
