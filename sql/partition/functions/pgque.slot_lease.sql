-- Leases.
--
-- Renewals write no row version: the lease row (owner, epoch, ttl, the
-- expiry set by the claim) changes only when the owner changes. A lease is
-- live until _lease_until: the later of that expiry and the time of the
-- slot subscription's newest state record plus the ttl. Every state change
-- of the slot is made by its owner, so consuming renews the lease, and a
-- renewal with nothing else to write appends a copy of the state
-- (_touch_state): an append, reclaimed by the state flips. Records older
-- than a claim are older than the expiry the claim set, so they never
-- extend a new owner's lease.
--
-- A slot is worked by the worker that holds its lease. claim_slot takes a
-- free or expired lease (epoch + 1, a new secret token) or renews one the
-- caller proves it holds (same epoch). Every receive/ack/nack on a slot
-- first checks, under the lease row's lock, that the caller presents the
-- lease's token: a worker whose lease was taken over, or anyone who merely
-- knows the owner's worker id, gets PQ085 and can neither receive nor ack.
-- An expired lease that nobody took over still belongs to its owner, whose
-- token still proves it (grace rule), so a slow but
-- sole worker is not fenced for nothing. Leases are plain short
-- transactions: they work through transaction-mode poolers. Times come
-- from clock_timestamp(), not the transaction start.

-- _check_worker(worker): validates a worker id.
-- _hold_lease tests the same before it calls this, _check_token and
-- _check_slot: keep its test in step with theirs.
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

-- Lease row locks. A handler's transaction that completed an event
-- (complete_partitioned_in_tx) holds FOR KEY SHARE on the lease row until
-- it commits, and a change of owner (claim_slot taking the slot) takes FOR
-- UPDATE, which waits for it: the fence. The owner's own calls (receive,
-- ack, nack, hold, settle, renewal, release; _hold_lease and _lease) take
-- FOR NO KEY UPDATE, which serialises them with each other and with a
-- claim, but not with the handlers' open transactions. When they took FOR
-- UPDATE (and the completion FOR SHARE), each of the slot's receives and
-- holds waited for every handler transaction in flight on it from its
-- completion to its commit, and one that stayed open there (a commit
-- waiting on a synchronous standby, a handler that completes early in a
-- transaction of its own) stopped the whole slot: its receives failed
-- with 55P03 every 2 s until it ended. Nothing else is lost: the owner's calls never change what a handler's completion
-- checked (the clients acknowledge a chunk, and settle a held key, only
-- after its handlers committed), and a release leaves the slot to a claim,
-- which waits.

-- _lease(queue, consumer, slot): the slot's lease row, locked (FOR NO KEY
-- UPDATE: see "Lease row locks" above). PQ034 when
-- the slot is not subscribed; a NULL slot (22004) or one outside 0..N-1 of
-- the persisted N (PQ011) is an invalid argument, not a missing slot.
-- The owner's calls hold the lock for a moment only, so the wait for it is
-- bounded: a transaction that keeps the row locked (it can only be an
-- owner's, or a successful claim's, left open) makes the others fail after
-- 2 seconds with 55P03 (lock_not_available), which is retryable.
create or replace function pgque._lease(i_queue text, i_consumer text, i_slot integer)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
declare
    l pgque.slot_lease;
begin
    select l1.* into l from pgque.slot_lease l1 join pgque.queue q on q.queue_id = l1.sl_queue
     where q.queue_name = i_queue and l1.sl_consumer = i_consumer and l1.sl_slot = i_slot
       for no key update of l1;
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

-- _lease_until(lease): when the lease expires (see the header).
create or replace function pgque._lease_until(l pgque.slot_lease)
returns timestamptz language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_last timestamptz;
begin
    select st_time into v_last from pgque.sub_state where st_sub = l.sl_sub order by st_seq desc limit 1;
    return greatest(l.sl_until, v_last + l.sl_ttl);
end;
$$;

-- _lease_ttl(ttl, now): the ttl as the real duration it has from now
-- (intervals compare a month as 30 days, so '10000 years -3599999 days'
-- would otherwise pass a 1-day cap), checked to be positive and at most one
-- day (PQ011).
create or replace function pgque._lease_ttl(i_ttl interval, i_now timestamptz)
returns interval language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_real interval;
begin
    -- Bound what the value does before using it: a ttl whose end is past
    -- the last timestamp overflows the addition itself (22008), and that
    -- is the same bad argument as any other ttl over a day.
    begin
        v_real := (i_now + i_ttl) - i_now;
    exception when datetime_field_overflow or interval_field_overflow or numeric_value_out_of_range then
        v_real := null;
    end;
    if v_real is null or v_real <= interval '0' or i_now + v_real > i_now + interval '1 day' then
        raise exception using errcode = 'PQ011',
            message = format('lease ttl must be positive and at most 1 day, not %s', coalesce(i_ttl::text, 'NULL'));
    end if;
    return v_real;
end;
$$;

-- Lease tokens. The worker id is a display name: it is visible in the
-- lease views, in presence and in messages, so it proves nothing. The claim
-- that takes a lease returns a fresh random token (gen_random_uuid, 122
-- random bits) to the caller alone and stores only its SHA-256 in the lease
-- row; every call that acts as the holder presents (worker, token) and
-- _lease_proved checks it. A new owner gets a new token, so an earlier
-- owner's token is refused after a takeover.

-- Forms without a token.
drop function if exists pgque.claim_slot(text, text, integer, text, interval);
drop function if exists pgque.release_slot(text, text, integer, text);
drop function if exists pgque._hold_lease(text, text, integer, integer, text);

-- _token_hash(token): what the lease row stores of a token. This and
-- _lease_proved are SQL-standard bodies (parsed once, at install, with
-- the installer's search_path) and have no SET clause, so the planner
-- inlines them into the holder checks every receive and ack makes.
create or replace function pgque._token_hash(i_token uuid)
returns bytea language sql immutable
return sha256(uuid_send(i_token));

-- _lease_proved(lease, worker, token): whether (worker, token) proves the
-- lease: the lease has an owner, it is worker, and token hashes to the
-- stored hash. A lease left from before tokens (no hash) proves nothing
-- until it is claimed again.
create or replace function pgque._lease_proved(l pgque.slot_lease, i_worker text, i_token uuid)
returns boolean language sql immutable
return coalesce(l.sl_owner = i_worker and l.sl_token = pgque._token_hash(i_token), false);

-- _check_token(token): a NULL token is a missing argument (22004).
create or replace function pgque._check_token(i_token uuid)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_token is null then
        raise exception using errcode = '22004', message = 'lease token must not be NULL';
    end if;
end;
$$;

-- Dead holders. A worker process that dies without releasing its slots
-- (SIGKILL, the OOM killer, a lost node) would leave them unworked for the
-- rest of their ttl, 30 s by default. PostgreSQL knows sooner: the
-- backends of a dead client's connections exit. A holder may therefore
-- bind its lease to its own LISTEN session (claim_slot's session: the
-- pg_backend_pid() of a connection it keeps for its whole life and loses
-- only with its process, or when that connection breaks). A claim that
-- finds a live lease bound to a session that is no longer a backend of the
-- cluster records when it first found it so (lease_orphan) and is refused;
-- a claim once that record is a sixth of the lease's ttl old (5 s by
-- default) takes the lease over, as if it had expired, with a new epoch
-- and token. The sixth is the holder's margin: a holder whose process is
-- alive and sees its session break fences the slots bound to it at once
-- (it cannot know whether it is the session or the process that another
-- claimer saw gone) and claims them again through the same path.
--
-- Only the holder binds (its token proves the lease), and what it binds can
-- only make its own lease end sooner. A pid that comes back as another
-- backend, or a session a pooler keeps open after its client went (session
-- pooling), reads as alive: the lease then simply waits out its ttl, as an
-- unbound one does. The check reads pg_stat_get_activity(pid), whose pid
-- column every role sees.

-- _session_gone(pid): whether pid is no backend of this cluster now.
create or replace function pgque._session_gone(i_pid integer)
returns boolean language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select not exists (select 1 from pg_catalog.pg_stat_get_activity(i_pid) a where a.pid = i_pid)
$$;

-- _check_session(session): a session to bind must be a backend of this
-- cluster now (PQ011 otherwise): a pid that is not is a caller's mistake
-- that would end its own lease early.
create or replace function pgque._check_session(i_session integer)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_session is not null and pgque._session_gone(i_session) then
        raise exception using errcode = 'PQ011',
            message = format('session %s is not a backend of this cluster: bind the pg_backend_pid() of a connection the worker keeps open', i_session);
    end if;
end;
$$;

-- Forms before sessions.
drop function if exists pgque.claim_slot(text, text, integer, text, interval, uuid);

-- claim_slot(queue, consumer, slot, worker, ttl, token, session): takes the
-- slot's lease for worker, or renews it. Returns (epoch, token): a free or
-- expired lease is taken with epoch + 1 and a new token, which only this
-- answer ever carries (keep it secret: it is the lease's credential); a
-- lease that (worker, token) proves is renewed with the same epoch and
-- token, even after it expired if nobody took it over. Returns (NULL, NULL)
-- when another live lease holds the slot, including one held under
-- worker's own id that token does not prove. session (optional) binds the
-- lease to the caller's LISTEN session, and a renewal moves the binding to
-- the session it names (NULL unbinds): see "Dead holders" above; a live
-- lease bound to a session that is gone is taken over a sixth of its ttl
-- after a claim first found it gone. A refused claim holds no lock on the
-- lease row afterwards (the lock is taken in a subtransaction that is
-- rolled back), so a caller leaving it open in a transaction cannot block
-- the owner. Tables: slot_lease (update on a change of owner, ttl or
-- session), sub_state (append on a renewal), lease_orphan.
create or replace function pgque.claim_slot(i_queue text, i_consumer text, i_slot integer, i_worker text,
                                            i_ttl interval default '30 seconds', i_token uuid default null,
                                            i_session integer default null,
                                            out epoch bigint, out token uuid)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l        pgque.slot_lease;
    v_now    timestamptz := clock_timestamp();
    v_ttl    interval;
    v_held   boolean;
    v_gone   boolean := false;
    v_since  timestamptz;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_worker(i_worker);
    v_ttl := pgque._lease_ttl(i_ttl, v_now);
    if i_slot is null then
        raise exception using errcode = '22004', message = 'slot must not be NULL';
    end if;
    perform pgque._check_session(i_session);
    begin
        l := pgque._lease(i_queue, i_consumer, i_slot);
        v_held := pgque._lease_proved(l, i_worker, i_token);
        if not v_held and l.sl_owner is not null and pgque._lease_until(l) > v_now then
            v_gone := l.sl_session is not null and pgque._session_gone(l.sl_session);
            if v_gone then
                select min(o.lo_seen) into v_since from pgque.lease_orphan o
                 where o.lo_sub = l.sl_sub and o.lo_epoch = l.sl_epoch and o.lo_session = l.sl_session;
            end if;
            if not v_gone or v_since is null or v_since > v_now - l.sl_ttl / 6 then
                -- Refused: undo the row lock with the subtransaction.
                raise exception using errcode = 'PQ099';
            end if;
        end if;
    exception when sqlstate 'PQ099' then
        if v_gone and v_since is null then
            -- The first claim to find the holder's session gone: the
            -- record outlives the rolled-back subtransaction.
            insert into pgque.lease_orphan (lo_sub, lo_epoch, lo_session, lo_seen)
            values (l.sl_sub, l.sl_epoch, l.sl_session, v_now);
        end if;
        return;
    end;
    if v_held then
        if l.sl_ttl = v_ttl and l.sl_session is not distinct from i_session then
            -- A renewal: an appended state record, no row version.
            perform pgque._touch_state(l.sl_sub);
        else
            update pgque.slot_lease set sl_until = v_now + v_ttl, sl_ttl = v_ttl, sl_session = i_session
             where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
        end if;
        epoch := l.sl_epoch;
        token := i_token;
        return;
    end if;
    -- A change of owner waits for the previous owner's handlers'
    -- transactions that completed an event (_lease_for_takeover).
    perform pgque._lease_for_takeover(l);
    token := pg_catalog.gen_random_uuid();
    update pgque.slot_lease
       set sl_owner = i_worker, sl_until = v_now + v_ttl, sl_ttl = v_ttl, sl_epoch = sl_epoch + 1,
           sl_token = pgque._token_hash(token), sl_session = i_session
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
    epoch := l.sl_epoch + 1;
    -- The records of this slot's earlier holders, and any a day old (a
    -- subscription dropped meanwhile): never waiting for a row another
    -- claim left locked.
    delete from pgque.lease_orphan o
     where o.ctid = any (array(select o2.ctid from pgque.lease_orphan o2
                                where o2.lo_sub = l.sl_sub or o2.lo_seen < v_now - interval '1 day'
                                  for update skip locked));
end;
$$;

-- _lease_for_takeover(lease): locks the lease row FOR UPDATE before its
-- owner changes, which waits for the previous owner's handlers'
-- transactions that completed an event (FOR KEY SHARE, "Lease row locks"
-- above), so that none commits once the slot is another's. Waited for at
-- most 2 s, as _lease waits (55P03, retried by the claimer's next pass): a
-- handler's transaction left open must not hold the claimer.
create or replace function pgque._lease_for_takeover(l pgque.slot_lease)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
begin
    perform 1 from pgque.slot_lease
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot
       for update;
end;
$$;

-- release_slot(queue, consumer, slot, worker, token): gives the lease up.
-- Only its holder can: returns true when released; PQ085 when (worker,
-- token) does not prove the lease (see _hold_lease). Tables: slot_lease.
create or replace function pgque.release_slot(i_queue text, i_consumer text, i_slot integer, i_worker text,
                                              i_token uuid)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_worker(i_worker);
    perform pgque._check_token(i_token);
    if i_slot is null then
        raise exception using errcode = '22004', message = 'slot must not be NULL';
    end if;
    l := pgque._lease(i_queue, i_consumer, i_slot);
    perform pgque._refuse_unproved(l, i_worker, i_token);
    update pgque.slot_lease set sl_owner = null, sl_until = null, sl_token = null
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
    return true;
end;
$$;

-- _refuse_unproved(lease, worker, token): raises PQ085 unless (worker,
-- token) proves the lease. The message names the slot only: never the
-- token, nor the owner's worker id (a caller may have presented it).
create or replace function pgque._refuse_unproved(l pgque.slot_lease, i_worker text, i_token uuid)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if not pgque._lease_proved(l, i_worker, i_token) then
        raise exception using errcode = 'PQ085',
            message = format('the lease token does not prove the lease on slot %s of consumer %L',
                             l.sl_slot, l.sl_consumer),
            hint = 'claim the slot again: claim_slot returns a new token';
    end if;
end;
$$;

-- _hold_lease(queue, consumer, slot, nslots, worker, token): the lease row,
-- locked, after checking N and that (worker, token) proves the lease (PQ085
-- otherwise: the lease changed hands, was released, or the caller never
-- held it). Every call that acts as the holder goes through here.
-- Renews the lease when less than half of its ttl is left: the heartbeat
-- rides on the per-batch calls, at most two appended state records per ttl
-- when the slot writes no state otherwise. Every lock it waits for (the
-- lease row, sub_state for the newest record, and for a renewal the
-- subscription's lock) is waited for at most lock_timeout, 2 s, then
-- 55P03, which callers retry.
create or replace function pgque._hold_lease(i_queue text, i_consumer text, i_slot integer,
                                             i_nslots integer, i_worker text, i_token uuid)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
declare
    r     record;
    l     pgque.slot_lease;
    v_now timestamptz;
begin
    -- The arguments' checks, called only when a test below fails (they
    -- raise its error): three calls on every receive and ack cost more
    -- than the tests.
    if i_worker is null or i_worker = '' or octet_length(i_worker) > 200 or i_token is null
       or i_slot is null or i_nslots is null or i_nslots < 1 or i_nslots > 1024
       or i_slot < 0 or i_slot >= i_nslots then
        perform pgque._check_worker(i_worker);
        perform pgque._check_token(i_token);
        perform pgque._check_slot(i_slot, i_nslots);
    end if;
    -- One statement for what _slot_group and _lease read apart (every
    -- receive and ack comes here): the group's N, the lease row locked
    -- (waited for at most lock_timeout, as _lease does) and its newest
    -- state record's time (_lease_until). When something is missing or
    -- N differs, those two raise the error they always raised.
    select g.sg_nslots, l1 as lease,
           (select st.st_time from pgque.sub_state st
             where st.st_sub = l1.sl_sub order by st.st_seq desc limit 1) as last_state
      into r
      from pgque.queue q
      join pgque.slot_group g on g.sg_queue = q.queue_id and g.sg_consumer = i_consumer
      join pgque.slot_lease l1 on l1.sl_queue = q.queue_id and l1.sl_consumer = i_consumer and l1.sl_slot = i_slot
     where q.queue_name = i_queue
       for no key update of l1;
    if found and r.sg_nslots = i_nslots then
        l := r.lease;
        l.sl_until := greatest(l.sl_until, r.last_state + l.sl_ttl);
    else
        -- The errors they raise, or the lease after a subscription
        -- committed meanwhile.
        perform pgque._slot_group(i_queue, i_consumer, i_nslots);
        l := pgque._lease(i_queue, i_consumer, i_slot);
        l.sl_until := pgque._lease_until(l);
    end if;
    if not pgque._lease_proved(l, i_worker, i_token) then
        perform pgque._refuse_unproved(l, i_worker, i_token);
    end if;
    v_now := clock_timestamp();
    if l.sl_until - v_now < l.sl_ttl / 2 then
        perform pgque._touch_state(l.sl_sub);
        l.sl_until := v_now + l.sl_ttl;
    end if;
    return l;
end;
$$;
