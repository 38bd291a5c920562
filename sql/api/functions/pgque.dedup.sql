-- Producer dedup: an idempotency key on send/send_batch, remembered per
-- queue for a window (set_queue_config(queue, 'dedup_window', ...), default
-- 5 minutes). Storage and rotation are described in api/structure/dedup.sql.
-- Keys are per queue: records carry the queue id.
--
-- Concurrency. Senders of one key in one queue are serialised by a
-- transaction-scoped advisory lock on hashtextextended(key,
-- hashtext(queue)) (from the name, so no lookup precedes the lock): the
-- second waits until the first commits or rolls back, then (READ COMMITTED:
-- each statement takes a new snapshot) sees the first's record and returns
-- its ev_id, or finds none and sends. The lock covers both generations
-- (see _dedup_rotate for why a rotation in between changes nothing). Under REPEATABLE READ
-- or SERIALIZABLE the waiter's snapshot cannot see what the first one
-- committed, so instead of sending a duplicate it fails with SQLSTATE 40001
-- (retry the transaction); the unique index raises the same for a record it
-- cannot see. A hash collision between two keys only makes one wait for the
-- other.

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
    insert into pgque.queue_dedup (qd_queue, qd_window) values (i_queue_id, v_ivl)
    on conflict (qd_queue) do update set qd_window = excluded.qd_window;
end;
$$;

-- _dedup_rotate(): once the current generation is as old as the longest
-- window of any queue, plus a second of margin, truncates the other
-- generation and makes it current. A record is always written with a time
-- taken before its sender read which generation is current, so a sender
-- that read it just before a switch writes into the older generation a
-- record no younger than the switch: a window later it is expired there
-- too. A keyed send that stored a record has read both generations, so the
-- truncate also waits for its transaction to end. It waits at most 200 ms
-- and otherwise tries again at the next maint(). Returns 1 when it rotated.
-- Not granted: maint() calls it.
create or replace function pgque._dedup_rotate()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.dedup_state;
    v_max  interval;
    v_next integer;
    v_lt   text := current_setting('lock_timeout');
begin
    select * into s from pgque.dedup_state for update skip locked;
    if not found then
        return 0;
    end if;
    -- With no key stored there is nothing to expire: leave the state row
    -- alone, so a system that uses no dedup keys makes no row version here
    -- (under a held horizon every switch leaves one behind).
    if not exists (select 1 from pgque.dedup_0) and not exists (select 1 from pgque.dedup_1) then
        return 0;
    end if;
    select coalesce(max(coalesce(d.qd_window, interval '5 minutes')), interval '5 minutes') into v_max
      from pgque.queue q left join pgque.queue_dedup d on d.qd_queue = q.queue_id;
    if clock_timestamp() - s.ds_switch_time < v_max + interval '1 second' then
        return 0;
    end if;
    v_next := 1 - s.ds_cur;
    begin
        perform set_config('lock_timeout', '200ms', true);
        if v_next = 0 then
            truncate pgque.dedup_0;
        else
            truncate pgque.dedup_1;
        end if;
        perform set_config('lock_timeout', v_lt, true);
    exception when lock_not_available then
        perform set_config('lock_timeout', v_lt, true);
        return 0;
    end;
    update pgque.dedup_state set ds_cur = v_next, ds_switch_time = clock_timestamp();
    return 1;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('queue_config', 'dedup_window', 'pgque._dedup_set_window(integer, text)'),
    ('maint', 'dedup_rotate', 'pgque._dedup_rotate()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- _dedup_check_keys(keys): raises PQ063 for an empty key or one longer
-- than 512 bytes, and PQ011 for more than 1000 keys in one call (each
-- distinct key holds a lock-table entry until the transaction ends). NULL
-- elements are allowed (they mean "no key").
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
        raise exception using errcode = 'PQ063',
            message = format('dedup key %s is %s; a dedup key is 1 to 512 bytes, or NULL for none', v_pos,
                             case when i_keys[v_pos] = '' then 'empty'
                                  else format('%s bytes long', octet_length(i_keys[v_pos])) end);
    end if;
    if cardinality(i_keys) > 1000 and (select count(k) from unnest(i_keys) k) > 1000 then
        raise exception using errcode = 'PQ011',
            message = format('%s dedup keys in one call; send at most 1000 keyed events per send_batch',
                             (select count(k) from unnest(i_keys) k));
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
-- the queue's window, or sends the event, records it and returns its
-- ev_id. The queue row, its window and the current generation are read
-- after the lock, so a sender that waited writes where things are now.
-- Static SQL only (plans cached).
-- Tables: reads pgque.queue, queue_dedup, dedup_state, dedup_0/1; inserts
-- into pgque.event and dedup_0/1 (updates a record only to reuse one past
-- its window).
-- No SET search_path: it is granted to no one and called only by send and
-- send_batch, SECURITY DEFINER functions that pin search_path, whose
-- setting it runs under; the SET clause cost a keyed send about 3% of its
-- server instructions.
create or replace function pgque._dedup_send(
    i_queue text, i_type text, i_data text, i_partition_key text, i_dedup_key text)
returns bigint language plpgsql
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
    v_rgen   integer;
    v_id     bigint;
    v_confined boolean;
begin
    -- The queue, its window and the current generation.
    select 'produce' = any (q.queue_confined), q.queue_id, q.queue_id * 16 + q.queue_cur_table, q.queue_event_seq,
           coalesce((select d.qd_window from pgque.queue_dedup d where d.qd_queue = q.queue_id), interval '5 minutes'),
           (select s.ds_cur from pgque.dedup_state s)
      into v_confined, v_qid, v_part, v_seq, v_window, v_cur
      from pgque.queue q where q.queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(v_qid, 'produce'); -- access check
    end if;
    -- The key's newest record, live or not: in the current generation if
    -- it is there, else in the other one. Separate static probes (one
    -- index lookup each) cost less than one statement over both.
    if v_cur = 0 then
        select dd_ev_id, dd_time into v_rid, v_rtime from pgque.dedup_0 where dd_queue = v_qid and dd_key = i_dedup_key;
        if found then
            v_rgen := 0;
        else
            select dd_ev_id, dd_time into v_rid, v_rtime from pgque.dedup_1 where dd_queue = v_qid and dd_key = i_dedup_key;
        end if;
    else
        select dd_ev_id, dd_time into v_rid, v_rtime from pgque.dedup_1 where dd_queue = v_qid and dd_key = i_dedup_key;
        if found then
            v_rgen := 1;
        else
            select dd_ev_id, dd_time into v_rid, v_rtime from pgque.dedup_0 where dd_queue = v_qid and dd_key = i_dedup_key;
        end if;
    end if;
    if v_rtime > v_now - v_window then
        return v_rid;
    end if;
    -- The event, as _insert_event writes it (inlined: this is the hot path).
    v_id := nextval(v_seq);
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
    values (v_id, v_part, i_type, i_data, i_partition_key);

    if v_rgen = v_cur then
        -- A record past its window in the current generation: reuse it.
        if v_cur = 0 then
            update pgque.dedup_0 set dd_ev_id = v_id, dd_time = v_now where dd_queue = v_qid and dd_key = i_dedup_key;
        else
            update pgque.dedup_1 set dd_ev_id = v_id, dd_time = v_now where dd_queue = v_qid and dd_key = i_dedup_key;
        end if;
    elsif current_setting('transaction_isolation') = 'read committed' then
        -- The key's lock is held and the lookup saw every committed record,
        -- so the key is not in the current generation: a plain insert.
        if v_cur = 0 then
            insert into pgque.dedup_0 (dd_queue, dd_key, dd_ev_id, dd_time) values (v_qid, i_dedup_key, v_id, v_now);
        else
            insert into pgque.dedup_1 (dd_queue, dd_key, dd_ev_id, dd_time) values (v_qid, i_dedup_key, v_id, v_now);
        end if;
    else
        -- Under a transaction snapshot a record committed since it was
        -- taken is invisible to the lookup: the unique index still sees
        -- it, and a conflict is a serialisation failure.
        if v_cur = 0 then
            insert into pgque.dedup_0 (dd_queue, dd_key, dd_ev_id, dd_time) values (v_qid, i_dedup_key, v_id, v_now)
            on conflict (dd_queue, dd_key) do nothing;
        else
            insert into pgque.dedup_1 (dd_queue, dd_key, dd_ev_id, dd_time) values (v_qid, i_dedup_key, v_id, v_now)
            on conflict (dd_queue, dd_key) do nothing;
        end if;
        if not found then
            raise exception using errcode = '40001',
                message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
        end if;
    end if;
    return v_id;
end;
$$;
