-- Producer dedup: an idempotency key on send/send_batch, remembered per
-- queue for a window (set_queue_config(queue, 'dedup_window', ...), default
-- 5 minutes). Storage and rotation are described in api/structure/dedup.sql.
--
-- Concurrency. Senders of one key in one queue are serialised by a
-- transaction-scoped advisory lock on hashtextextended(key,
-- hashtext(queue)) (from the name, so no lookup precedes the lock): the
-- second waits until the first commits or rolls back, then (READ COMMITTED:
-- each statement takes a new snapshot) sees the first's record and returns
-- its ev_id, or finds none and sends. The lock covers both generations,
-- and rotation cannot happen while a keyed sender's transaction is open
-- (see _dedup_rotate). Under REPEATABLE READ
-- or SERIALIZABLE the waiter's snapshot cannot see what the first one
-- committed, so instead of sending a duplicate it fails with SQLSTATE 40001
-- (retry the transaction); the unique index raises the same for a record it
-- cannot see. A hash collision between two keys only makes one wait for the
-- other.

-- _dedup_attach(queue_id): creates a queue's dedup partitions and state
-- row if they are missing. Idempotent. Called when a queue is created and
-- by the install for queues that predate the feature.
create or replace function pgque._dedup_attach(i_queue_id integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_gen integer;
begin
    for v_gen in 0 .. 1 loop
        if to_regclass(format('pgque.dedup_%s_%s', i_queue_id, v_gen)) is null then
            execute format('create table pgque.%I partition of pgque.dedup for values in (%s)',
                           format('dedup_%s_%s', i_queue_id, v_gen), i_queue_id * 2 + v_gen);
        end if;
    end loop;
    insert into pgque.queue_dedup (qd_queue) values (i_queue_id) on conflict do nothing;
end;
$$;

-- Trigger on pgque.queue: a new queue gets its dedup storage, a dropped one
-- loses it.
create or replace function pgque._dedup_queue_trigger()
returns trigger language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_gen integer;
begin
    if tg_op = 'INSERT' then
        perform pgque._dedup_attach(new.queue_id);
    else
        for v_gen in 0 .. 1 loop
            execute format('drop table if exists pgque.%I', format('dedup_%s_%s', old.queue_id, v_gen));
        end loop;
    end if;
    return null;
end;
$$;

do $trg$
begin
    if not exists (select 1 from pg_catalog.pg_trigger
                    where tgrelid = 'pgque.queue'::regclass and tgname = 'pgque_dedup_storage') then
        create trigger pgque_dedup_storage after insert or delete on pgque.queue
            for each row execute function pgque._dedup_queue_trigger();
    end if;
end
$trg$;

select pgque._dedup_attach(queue_id) from pgque.queue;

-- _dedup_set_window(queue_id, value): the 'dedup_window' queue setting.
-- value is an interval between 1 second and 7 days; raises PQ011 otherwise.
create or replace function pgque._dedup_set_window(i_queue_id integer, i_value text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_ivl interval;
begin
    begin
        v_ivl := i_value::interval;
    exception when others then
        raise exception using errcode = 'PQ011', message = format('dedup_window must be an interval, not %L', i_value);
    end;
    if v_ivl < interval '1 second' or v_ivl > interval '7 days' then
        raise exception using errcode = 'PQ011',
            message = format('dedup_window must be between 1 second and 7 days, not %s', i_value);
    end if;
    perform pgque._dedup_attach(i_queue_id);
    update pgque.queue_dedup set qd_window = v_ivl where qd_queue = i_queue_id;
end;
$$;

-- _dedup_rotate(): for every queue whose current dedup generation is a
-- window (plus a second of margin for a sender that read the generation
-- just before a switch) old, truncates the other generation and makes it current. Every
-- record in the other generation was written before the current one began,
-- more than a window ago. Every keyed sender reads both generations, so
-- the truncate waits for every open transaction that sent a key to this
-- queue: no send can straddle a rotation, and a long such transaction only
-- delays it. It waits at most 200 ms and otherwise tries again at the next
-- maint().
-- Returns the number of queues rotated. Not granted: maint() calls it.
create or replace function pgque._dedup_rotate()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    d      pgque.queue_dedup;
    v_next integer;
    v_n    integer := 0;
    v_lt   text := current_setting('lock_timeout');
begin
    for d in select * from pgque.queue_dedup
              where clock_timestamp() - qd_switch_time >= qd_window + interval '1 second'
              order by qd_queue for update skip locked loop
        v_next := 1 - d.qd_cur;
        begin
            perform set_config('lock_timeout', '200ms', true);
            execute format('truncate pgque.%I', format('dedup_%s_%s', d.qd_queue, v_next));
            perform set_config('lock_timeout', v_lt, true);
        exception when lock_not_available then
            perform set_config('lock_timeout', v_lt, true);
            continue;
        end;
        update pgque.queue_dedup set qd_cur = v_next, qd_switch_time = clock_timestamp()
         where qd_queue = d.qd_queue;
        v_n := v_n + 1;
    end loop;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('queue_config', 'dedup_window', 'pgque._dedup_set_window(integer, text)'),
    ('maint', 'dedup_rotate', 'pgque._dedup_rotate()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- _dedup_check_keys(keys): raises PQ050 for an empty key or one longer
-- than 512 bytes. NULL elements are allowed (they mean "no key").
create or replace function pgque._dedup_check_keys(i_keys text[])
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_pos integer;
begin
    select u.ord into v_pos from unnest(i_keys) with ordinality u(k, ord)
     where u.k = '' or octet_length(u.k) > 512 order by u.ord limit 1;
    if found then
        raise exception using errcode = 'PQ050',
            message = format('dedup key %s is %s; a dedup key is 1 to 512 bytes, or NULL for none', v_pos,
                             case when i_keys[v_pos] = '' then 'empty'
                                  else format('%s bytes long', octet_length(i_keys[v_pos])) end);
    end if;
end;
$$;

-- Signatures of an earlier layout of these helpers.
drop function if exists pgque._dedup_lock(integer, text[]);
drop function if exists pgque._dedup_send(integer, text, text, text, text, text);

-- _dedup_lock(queue, keys): takes the advisory lock of every distinct
-- non-NULL key, in lock-key order so two batches cannot deadlock on each
-- other. Outside READ COMMITTED a lock that had to be waited for raises
-- 40001.
create or replace function pgque._dedup_lock(i_queue text, i_keys text[])
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_h bigint;
begin
    for v_h in select distinct hashtextextended(k, hashtext(i_queue)) h from unnest(i_keys) k
                where k is not null order by h loop
        if not pg_try_advisory_xact_lock(v_h) then
            perform pg_advisory_xact_lock(v_h);
            if current_setting('transaction_isolation') <> 'read committed' then
                raise exception using errcode = '40001',
                    message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
            end if;
        end if;
    end loop;
end;
$$;

-- _dedup_send(queue, type, data, partition_key, dedup_key): with the key's
-- lock held (_dedup_lock), returns the ev_id recorded for the key within
-- the window, or sends the event, records it and returns its ev_id. The
-- queue's window, dedup generation and current event table are read after
-- the lock, in the same statement as the lookup, so a sender that waited
-- writes where the queue is now. Static SQL only (plans cached). Tables:
-- reads pgque.queue, pgque.queue_dedup and pgque.dedup; inserts into
-- pgque.event and pgque.dedup (updates a dedup record only to reuse one
-- past its window).
create or replace function pgque._dedup_send(
    i_queue text, i_type text, i_data text, i_partition_key text, i_dedup_key text)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now    timestamptz := clock_timestamp();
    v_qid    integer;
    v_part   integer;
    v_seq    regclass;
    v_window interval;
    v_cur    integer;
    v_rid    bigint;
    v_rtime  timestamptz;
    v_rpart  integer;
    v_id     bigint;
begin
    -- The key's newest record, live or not (dd_part = any (...) rather than
    -- a range: the unique index leads with dd_part, and only equality lets
    -- it go straight to the key).
    select q.queue_id, q.queue_id * 16 + q.queue_cur_table, q.queue_event_seq, d.qd_window, d.qd_cur,
           r.dd_ev_id, r.dd_time, r.dd_part
      into v_qid, v_part, v_seq, v_window, v_cur, v_rid, v_rtime, v_rpart
      from pgque.queue q join pgque.queue_dedup d on d.qd_queue = q.queue_id
      left join lateral (select dd.dd_ev_id, dd.dd_time, dd.dd_part from pgque.dedup dd
                          where dd.dd_part = any (array[q.queue_id * 2, q.queue_id * 2 + 1]) and dd.dd_key = i_dedup_key
                          order by dd.dd_time desc limit 1) r on true
     where q.queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_rtime > v_now - v_window then
        return v_rid;
    end if;
    -- The event, as _insert_event writes it (inlined: this is the hot path).
    v_id := nextval(v_seq);
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
    values (v_id, v_part, i_type, i_data, i_partition_key);

    if v_rpart = v_qid * 2 + v_cur then
        -- A record past its window in the current generation: reuse it.
        update pgque.dedup set dd_ev_id = v_id, dd_time = v_now
         where dd_part = v_qid * 2 + v_cur and dd_key = i_dedup_key;
    elsif current_setting('transaction_isolation') = 'read committed' then
        -- The key's lock is held and the lookup saw every committed record,
        -- so the key is not in the current generation: a plain insert.
        insert into pgque.dedup (dd_part, dd_key, dd_ev_id, dd_time)
        values (v_qid * 2 + v_cur, i_dedup_key, v_id, v_now);
    else
        -- Under a transaction snapshot a record committed since it was
        -- taken is invisible to the lookup: the unique index still sees
        -- it, and a conflict is a serialisation failure.
        insert into pgque.dedup (dd_part, dd_key, dd_ev_id, dd_time)
        values (v_qid * 2 + v_cur, i_dedup_key, v_id, v_now)
        on conflict (dd_part, dd_key) do nothing;
        if not found then
            raise exception using errcode = '40001',
                message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
        end if;
    end if;
    return v_id;
end;
$$;
