-- Producer dedup: an idempotency key on send/send_batch, remembered per
-- queue for a window (set_queue_config(queue, 'dedup_window', ...), default
-- 5 minutes). Storage and rotation are described in api/structure/dedup.sql:
-- the key is kept in its event's row. Keys are per queue (each event table
-- belongs to one queue).
--
-- Concurrency. Senders of one key in one queue wait for each other on the
-- key's unique index entry, never on a lock a role outside pgque could
-- take: an advisory lock on a key computed from the names was held by a
-- role with no grant and stopped every send of the key. The INSERT of a
-- keyed event into the current table waits for an uncommitted event of
-- the key there; the second sender then (READ COMMITTED: each statement
-- takes a new snapshot) sees the first's event and returns its ev_id, or
-- finds none and sends. A sender that must look into tables retired
-- within the window (a rotation since the window began) first waits the
-- same way for uncommitted events of its key in them (_dedup_wait: an
-- INSERT ... ON CONFLICT DO NOTHING in a subtransaction it rolls back);
-- a sender reusing an expired key waits on the generation tables' unique
-- index (_dedup_side_claim). Only pgque's functions can write these tables,
-- so only a sender of the key can make another one wait, and only until
-- it ends. Under REPEATABLE READ or SERIALIZABLE the waiter's snapshot
-- cannot see what the first one committed, so instead of sending a
-- duplicate it fails with SQLSTATE 40001 (retry the transaction).

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
    update pgque.queue set queue_dedup_window = v_ivl where queue_id = i_queue_id;
end;
$$;

-- _dedup_rotate(): once the current generation is as old as the longest
-- window of any queue, plus a second of margin, truncates the other
-- generation and makes it current. A record is always written with a time
-- taken before its sender read which generation is current, so a sender
-- that read it just before a switch writes into the older generation a
-- record no younger than the switch: a window later it is expired there
-- too (a record's time is its transaction's start). The truncate waits for
-- every transaction that read or wrote the generation; it waits at most
-- 200 ms and otherwise tries again at the next maint(). Returns 1 when it
-- rotated.
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
    select coalesce(max(coalesce(queue_dedup_window, interval '5 minutes')), interval '5 minutes') into v_max
      from pgque.queue;
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

-- _dedup_rotate_hold(queue_id, table_no): the 'rotate' hook. A table that
-- stopped being current less than the queue's window ago and holds keyed
-- events keeps them: every such row is at most as old as that moment, so
-- once the window has passed since then, none is within it. Returns why
-- the table is kept, or NULL. Not granted: rotation calls it.
create or replace function pgque._dedup_rotate_hold(i_queue_id integer, i_table integer)
returns text language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_retired timestamptz;
    v_window  interval;
    v_keys    boolean;
begin
    select queue_retired[i_table + 1], coalesce(queue_dedup_window, interval '5 minutes')
      into v_retired, v_window
      from pgque.queue where queue_id = i_queue_id;
    if v_retired is null or v_retired <= clock_timestamp() - v_window then
        return null;
    end if;
    execute format('select exists (select 1 from %s where ev_part = $1 and ev_dedup is not null)',
                   pgque._event_table(i_queue_id, i_table)) into v_keys using pgque._part(i_queue_id, i_table);
    if not v_keys then
        return null;
    end if;
    return format('dedup keys in the table written until %s are kept until %s (dedup_window %s)',
                  v_retired, v_retired + v_window, v_window);
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('queue_config', 'dedup_window', 'pgque._dedup_set_window(integer, text)'),
    ('maint', 'dedup_rotate', 'pgque._dedup_rotate()'),
    ('rotate', 'dedup_window', 'pgque._dedup_rotate_hold(integer, integer)')
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

-- Signatures of an earlier layout of these helpers, and the advisory
-- lock helper of the layout before the key index made senders wait.
drop function if exists pgque._dedup_lock(integer, text[]);
drop function if exists pgque._dedup_lock(text, text[]);
drop function if exists pgque._dedup_send(integer, text, text, text, text, text);

-- _dedup_wait(queue_id, cur, ntables, retired, expire, keys): waits until
-- no transaction but this one holds an uncommitted event with one of keys
-- in a table of the queue retired after expire (the caller's window),
-- other than cur. A plain SELECT of those tables cannot see such an event;
-- an INSERT of the key meets its index entry and waits for its
-- transaction. The INSERTs are undone with their subtransaction (one per
-- call, whatever the number of keys), so they leave no row a held horizon
-- keeps; keys are inserted in order, as the senders' own INSERTs are.
-- Under a transaction snapshot, a key committed since it was taken raises
-- 40001 from the INSERT. Not granted: _dedup_send and _send_batch call it
-- under a SECURITY DEFINER entry point. Tables: inserts into (and rolls
-- back) the queue's retired event tables.
create or replace function pgque._dedup_wait(i_queue_id integer, i_cur integer, i_ntab integer,
                                             i_retired timestamptz[], i_expire timestamptz, i_keys text[])
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_n integer;
begin
    begin
        for v_n in 0 .. i_ntab - 1 loop
            continue when v_n = i_cur or not coalesce(i_retired[v_n + 1] > i_expire, false);
            execute format('insert into %s (ev_id, ev_part, ev_dedup)
                            select 0, $1, k from (select distinct k from unnest($2) k where k is not null) d order by k
                            on conflict (ev_part, ev_dedup) where ev_dedup is not null do nothing',
                           pgque._event_table(i_queue_id, v_n))
               using pgque._part(i_queue_id, v_n), i_keys;
        end loop;
        raise exception using errcode = 'PQ099'; -- undo the INSERTs
    exception
        when sqlstate 'PQ099' then
            null;
        when serialization_failure then
            raise exception using errcode = '40001',
                message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
    end;
end;
$$;

-- _dedup_side_find(queue_id, key, expire): the ev_id of the key's record
-- in the generation tables written after expire, or NULL. Not granted.
create or replace function pgque._dedup_side_find(i_queue_id integer, i_key text, i_expire timestamptz)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id bigint;
begin
    select dd_ev_id into v_id from pgque.dedup_0
     where dd_queue = i_queue_id and dd_key = i_key and dd_time > i_expire;
    if not found then
        select dd_ev_id into v_id from pgque.dedup_1
         where dd_queue = i_queue_id and dd_key = i_key and dd_time > i_expire;
    end if;
    return v_id;
end;
$$;

-- _dedup_side_claim(queue_id, key, ev_id, expire): claims a reused key
-- for ev_id in the current generation, overwriting the key's expired
-- record there if it has one, and returns ev_id; or returns the ev_id of
-- a live record of the key (written after expire) that a concurrent
-- sender committed meanwhile. The generation that is not current is
-- waited on first, as _dedup_wait waits on event tables, so that a sender
-- that wrote there just before a generation switch is seen. Under a
-- transaction snapshot a record committed since it was taken raises
-- 40001. Not granted. Tables: dedup_state, dedup_0/1.
drop function if exists pgque._dedup_side_record(integer, text, bigint);
create or replace function pgque._dedup_side_claim(i_queue_id integer, i_key text, i_ev_id bigint,
                                                   i_expire timestamptz)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur  integer := (select ds_cur from pgque.dedup_state);
    v_tab  text := format('pgque.dedup_%s', v_cur);
    v_id   bigint;
    v_time timestamptz;
begin
    begin
        execute format('insert into pgque.dedup_%s (dd_queue, dd_key, dd_ev_id, dd_time) values ($1, $2, 0, now())
                        on conflict (dd_queue, dd_key) do nothing', 1 - v_cur)
           using i_queue_id, i_key;
        raise exception using errcode = 'PQ099'; -- undo the INSERT
    exception when sqlstate 'PQ099' then
        null;
    end;
    v_id := pgque._dedup_side_find(i_queue_id, i_key, i_expire);
    if v_id is not null then
        return v_id;
    end if;
    -- Only an expired record is overwritten: a concurrent sender's update
    -- is waited for, and its fresh record then no longer matches.
    execute format('update %s set dd_ev_id = $3, dd_time = now() where dd_queue = $1 and dd_key = $2 and dd_time <= $4',
                   v_tab) using i_queue_id, i_key, i_ev_id, i_expire;
    get diagnostics v_id = row_count;
    if v_id = 1 then
        return i_ev_id;
    end if;
    execute format('insert into %s (dd_queue, dd_key, dd_ev_id, dd_time) values ($1, $2, $3, now())
                    on conflict (dd_queue, dd_key) do nothing', v_tab) using i_queue_id, i_key, i_ev_id;
    get diagnostics v_id = row_count;
    if v_id = 1 then
        return i_ev_id;
    end if;
    execute format('select dd_ev_id, dd_time from %s where dd_queue = $1 and dd_key = $2', v_tab)
       into v_id, v_time using i_queue_id, i_key;
    if v_time > i_expire then
        return v_id;
    end if;
    raise exception using errcode = '40001',
        message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
end;
$$;

-- _dedup_send(queue, type, data, partition_key, dedup_key, how, id,
-- waited): returns the ev_id of the key's event within the queue's window,
-- or sends the event with the key and returns its ev_id (id when given,
-- else the next of the queue's sequence). A concurrent sender of the key
-- is waited for on the key's index entries (see the top of this file).
-- waited is the queue_switch_time as of which the caller already waited
-- on the retired tables for this key (_send_batch), or NULL.
--
-- The common case, a fresh key with no rotation in the last window, is
-- one INSERT into the current table: the index that refuses a second row
-- of the key is also the lookup. With how 'catch' (a single send) the
-- refusal is caught as a unique_violation, which costs a subtransaction;
-- INSERT ... ON CONFLICT into the partitioned parent costs more (mapping
-- the arbiter index to the partition scans pg_inherits on every call).
-- send_batch, whose subtransactions would pile up (past 64 they slow
-- every snapshot in the database), uses ON CONFLICT (how 'on conflict').
-- send runs the common case inline and, when the index refused its
-- INSERT, calls this with 'on conflict' (the refusal is then expected, and
-- a rotation in between cannot make it wrong). Only when the index
-- refuses (a retry, or a key reused after its window) is the existing row
-- read; only for a window after a rotation are the retired tables probed;
-- only a key whose expired row is found consults the generation tables.
-- Those rarer steps name their table with dynamic SQL, from the queue id
-- and table number (a query on pgque.event would plan and lock every
-- queue's tables). The window is measured back from now; a key's time is
-- the start of the transaction that sent it.
-- Tables: reads pgque.queue, the queue's event tables (and dedup_state,
-- dedup_0/1); inserts into pgque.event (and dedup_0/1).
-- No SET search_path: it is granted to no one and called only by send and
-- send_batch, SECURITY DEFINER functions that pin search_path, whose
-- setting it runs under; the SET clause cost a keyed send about 3% of its
-- server instructions.
drop function if exists pgque._dedup_send(text, text, text, text, text);
drop function if exists pgque._dedup_send(text, text, text, text, text, boolean);
drop function if exists pgque._dedup_send(text, text, text, text, text, text);
create or replace function pgque._dedup_send(
    i_queue text, i_type text, i_data text, i_partition_key text, i_dedup_key text, i_how text,
    i_id bigint default null, i_waited timestamptz default null)
returns bigint language plpgsql
as $$
declare
    v_confined boolean;
    v_qid      integer;
    v_cur      integer;
    v_ntab     integer;
    v_seq      regclass;
    v_switch   timestamptz;
    v_retired  timestamptz[];
    v_expire   timestamptz;
    v_side     boolean := false;
    v_n        integer;
    v_id       bigint;
    v_rid      bigint;
    v_rtime    timestamptz;
begin
    select 'produce' = any (queue_confined), queue_id, queue_cur_table, queue_ntables, queue_event_seq,
           queue_switch_time, queue_retired, clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
      into v_confined, v_qid, v_cur, v_ntab, v_seq, v_switch, v_retired, v_expire
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(v_qid, 'produce'); -- access check
    end if;

    -- A table retired within the window may hold the key's event (the
    -- last switch is the newest retirement).
    if v_switch > v_expire and v_retired is not null then
        if i_waited is distinct from v_switch then
            perform pgque._dedup_wait(v_qid, v_cur, v_ntab, v_retired, v_expire, array[i_dedup_key]);
        end if;
        for v_n in 0 .. v_ntab - 1 loop
            continue when v_n = v_cur or not coalesce(v_retired[v_n + 1] > v_expire, false);
            execute format('select ev_id, ev_time from %s where ev_part = $1 and ev_dedup = $2',
                           pgque._event_table(v_qid, v_n))
               into v_rid, v_rtime using pgque._part(v_qid, v_n), i_dedup_key;
            if v_rtime > v_expire then
                return v_rid;
            end if;
            -- An expired event: the key may have been reused since.
            v_side := v_side or v_rid is not null;
        end loop;
        if v_side then
            v_rid := pgque._dedup_side_find(v_qid, i_dedup_key, v_expire);
            if v_rid is not null then
                return v_rid;
            end if;
        end if;
    end if;

    v_id := coalesce(i_id, pgque._next_ev_id(v_seq));
    -- Under a transaction snapshot ON CONFLICT meets a key committed
    -- since the snapshot with its own 40001; the caught INSERT lets the
    -- refusal come to the lookup below, which says what happened.
    if i_how = 'catch' or current_setting('transaction_isolation') <> 'read committed' then
        begin
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
            values (v_id, pgque._part(v_qid, v_cur), i_type, i_data, i_partition_key, i_dedup_key);
            return v_id;
        exception when unique_violation then
            null; -- the current table holds the key: below
        end;
    else
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
        values (v_id, pgque._part(v_qid, v_cur), i_type, i_data, i_partition_key, i_dedup_key)
        on conflict (ev_part, ev_dedup) where ev_dedup is not null do nothing;
        if found then
            return v_id;
        end if;
    end if;

    -- The current table holds an event of the key: within the window it is
    -- the answer (v_id is left unused, as a rolled-back send leaves one).
    execute format('select ev_id, ev_time from %s where ev_part = $1 and ev_dedup = $2',
                   pgque._event_table(v_qid, v_cur))
       into v_rid, v_rtime using pgque._part(v_qid, v_cur), i_dedup_key;
    if v_rid is null then
        -- Committed after this transaction's snapshot (REPEATABLE READ):
        -- the index sees it, the snapshot does not.
        raise exception using errcode = '40001',
            message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
    end if;
    if v_rtime > v_expire then
        return v_rid;
    end if;
    -- The key is reused after its window, and its expired event still
    -- holds the key's place in this table: the new event goes in without
    -- the key, which is claimed in the generation tables instead (unless
    -- a live record of it is found there).
    v_rid := pgque._dedup_side_claim(v_qid, i_dedup_key, v_id, v_expire);
    if v_rid <> v_id then
        return v_rid;
    end if;
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
    values (v_id, pgque._part(v_qid, v_cur), i_type, i_data, i_partition_key);
    return v_id;
end;
$$;
