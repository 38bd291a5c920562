-- Producer dedup: an idempotency key on send/send_batch, remembered per
-- queue for a window (set_queue_config(queue, 'dedup_window', ...), default
-- 5 minutes). Storage and rotation are described in api/structure/dedup.sql.
--
-- Concurrency. Senders of one key in one queue are serialised by a
-- transaction-scoped advisory lock on hashtextextended(key, queue_id): the
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

-- _dedup_lock(queue_id, keys): takes the advisory lock of every distinct
-- non-NULL key, in hash order so two batches cannot deadlock on each other.
-- Outside READ COMMITTED a lock that had to be waited for raises 40001.
create or replace function pgque._dedup_lock(i_queue_id integer, i_keys text[])
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_h bigint;
begin
    for v_h in select distinct hashtextextended(k, i_queue_id) h from unnest(i_keys) k
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

-- _dedup_send(queue_id, queue, type, data, partition_key, dedup_key): with
-- the key's lock held (_dedup_lock), returns the ev_id recorded for the key
-- within the window, or sends the event, records it and returns its ev_id.
-- The queue's window and current generation are read after the lock, so a
-- sender that waited writes into the generation current when it proceeds.
-- Tables: reads pgque.queue_dedup and pgque.dedup, inserts into
-- pgque.dedup and (through _insert_event) pgque.event.
create or replace function pgque._dedup_send(
    i_queue_id integer, i_queue text, i_type text, i_data text, i_partition_key text, i_dedup_key text)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now    timestamptz := clock_timestamp();
    v_window interval;
    v_cur    integer;
    v_id     bigint;
begin
    select qd_window, qd_cur into v_window, v_cur from pgque.queue_dedup where qd_queue = i_queue_id;
    if not found then
        raise exception using errcode = 'PQ001', message = format('queue %L has no dedup storage', i_queue);
    end if;
    select dd_ev_id into v_id from pgque.dedup
     where dd_part between i_queue_id * 2 and i_queue_id * 2 + 1
       and dd_key = i_dedup_key and dd_time > v_now - v_window
     order by dd_time desc limit 1;
    if found then
        return v_id;
    end if;
    v_id := pgque._insert_event(i_queue, i_type, i_data, i_partition_key, null, null, null);
    -- A conflicting record here is one past its window (the lookup above
    -- saw no live one): reuse its slot. A live one the lookup could not
    -- see (another snapshot) leaves the statement without a row.
    insert into pgque.dedup as d (dd_part, dd_key, dd_ev_id, dd_time)
    values (i_queue_id * 2 + v_cur, i_dedup_key, v_id, v_now)
    on conflict (dd_part, dd_key) do update set dd_ev_id = excluded.dd_ev_id, dd_time = excluded.dd_time
     where d.dd_time <= v_now - v_window;
    if not found then
        raise exception using errcode = '40001',
            message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
    end if;
    return v_id;
end;
$$;
