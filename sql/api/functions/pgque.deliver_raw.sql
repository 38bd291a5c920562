-- The read path: chunked delivery with the payload as stored (text).
--
-- _deliver_raw is what receive, receive_raw and receive_partitioned run. It
-- keeps _deliver's contract (chunks of at most max rows and _chunk_bytes()
-- of data, redelivered until acknowledged, the state recording whether a
-- chunk reached the batch's end) at a lower cost per chunk: the batch is
-- read by one static statement (the slot predicate takes the slot and the
-- slot count as parameters), which cuts and returns the chunk in one pass;
-- every state change of the call is made in memory and appended as one
-- record; and the payload is handed out as the stored text, so nothing
-- parses it. Callers that promise jsonb cast it themselves. A chunk of a
-- batch far larger than a chunk is read from a window of ev_ids past the
-- acknowledged ones, so draining a batch costs in proportion to its size.
-- See "The read path" and "Large batches" in docs/design.md.

-- _deliver_raw(queue, subscription, max, slot, nslots, span, ack_batch):
-- the next unacknowledged chunk of the subscription's open batch, opening
-- one if needed (span: _batch_end's catch-up bound), restricted to slot of
-- nslots when nslots is greater than 1 (the routing rule of _slot_filter,
-- G1). With ack_batch, the chunk last handed out from that batch is
-- acknowledged first, as _ack would (PQ020 when it is not the open batch).
-- Returns the chunk's events in ev_id order, payload as stored. Every step
-- (acknowledge, finish, open, hand out) works on the state in memory under
-- the subscription's lock and the call appends at most one record, the
-- final state; a poll that finds nothing, or a redelivery, appends none.
-- Tables: event, tick (read), sub_state (insert), subscription (lock).
-- _deliver_raw has a second entry point, receive_raw (api/functions/
-- pgque.receive.sql documents it), made from the same body here, and a
-- third in the partition layer, receive_partitioned_raw, made from it by
-- way of _deliver_raw_body(). Why one body: a
-- PL/pgSQL function that returns another's rows with RETURN QUERY copies
-- every row into a second result store, a fifth of the read's server time
-- when receive_raw called _deliver_raw. The body is one constant of this
-- script; the entry point adds its own parameters' aliases (at
-- <declare>) and its access checks (at <entry>), and
-- receive_partitioned_raw the lease's epoch to every row (at <epoch>)
-- and what a receive that found nothing does (at <done>).
do $deliver_raw$
declare
    -- A chunk statement's rows: the queue's events (v_from, the columns
    -- and the queue's partitions), of the batch (a part of it, below), for
    -- this consumer and slot (v_mine), past the acknowledged ones.
    v_from constant text := $from$select ev.ev_id, ev.ev_type, ev.ev_data, ev.ev_retry, ev.ev_time,
                 ev.ev_extra1, ev.ev_extra2, ev.ev_extra3, ev.ev_extra4
            from pgque.event ev
           where ev.ev_part >= v_queue * 16 and ev.ev_part < v_queue * 16 + 16$from$;
    v_mine constant text := $mine$
             and pg_visible_in_snapshot(ev.ev_txid, v_cur)
             and (ev.ev_owner is null or ev.ev_owner = v_sub)
             and (i_nslots is null or i_nslots = 1
                  or (case when ev.ev_extra1 is null then 0
                           else (hashtextextended(ev.ev_extra1, 0) % i_nslots + i_nslots) % i_nslots end) = i_slot)$mine$;
    -- The rows both chunk statements cut: the batch's next max+1 rows
    -- past the acknowledged ones, for this consumer (and slot), in ev_id
    -- order. Put in at <rows>. The batch's two parts (the ev_txid range,
    -- the previous tick's running transactions) are two scans, each an
    -- index range on its ev_txid: written as one OR, the planner may find
    -- no index that bounds both and scan a routing index by slot alone,
    -- reading every row of the slot in the table (it does on a table
    -- without statistics: a new queue, a table rotation just emptied).
    -- No xid is in both parts.
    v_rows constant text := '(select u.* from (' || v_from || $rows$
             and ev.ev_txid >= pg_snapshot_xmax(v_prev) and ev.ev_txid < pg_snapshot_xmax(v_cur)
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$
          union all
          $rows$ || v_from || $rows$
             and cardinality(v_xip) > 1 and ev.ev_txid = any(v_xip)
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$) u
           order by u.ev_id
           limit i_max + 1)$rows$;
    -- The same rows as a reader reads them (see "Readers" below): its plan
    -- is made without the values of the list of running transactions, so
    -- they are probed one by one (an index seek per xid; the LIMIT keeps
    -- the planner from turning the lateral probe into a join), lest the
    -- plan bound that scan by ev_id alone and test the xids on every row
    -- of the slot. Inline, with the list's values known, the plain list
    -- plans as well and costs less to plan (the probe's subquery would be
    -- planned even when the list is only the 0).
    v_rrows constant text := '(select u.* from (' || v_from || $rows$
             and ev.ev_txid >= pg_snapshot_xmax(v_prev) and ev.ev_txid < pg_snapshot_xmax(v_cur)
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$
          union all
          select xe.* from unnest(v_xip) as xp(txid) cross join lateral ($rows$ || v_from || $rows$
             and ev.ev_txid = xp.txid
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$
           order by ev.ev_id limit i_max + 1) xe
           where cardinality(v_xip) > 1) u
           order by u.ev_id
           limit i_max + 1)$rows$;
    -- The same rows within a window of ev_ids that ends at v_lim: how a
    -- chunk of a large batch is read (see the loop below). Put in at
    -- <wrows>: statements of their own, so that their plans are never the
    -- plans of the ones above, and the batch's two parts (the ev_txid
    -- range, the previous tick's running transactions) apart, so that the
    -- planner does not trade the leading ev_txid for the window (it would
    -- scan the whole index): each part is an index range on
    -- (ev_txid, ev_id), ev_id tested within the index. An index range
    -- scans every entry of its xids, so a short range (at most 256 xids: a
    -- large transaction that committed between two ticks, the ticker
    -- running) goes to the list (v_txids: the running transactions, and
    -- the range's, that committed by the batch's end), where each xid is a
    -- seek to the window's start: the window then reads no entry outside
    -- it. No xid is in both parts.
    v_wrows constant text := '(select u.* from (' || v_from || $wrows$
             and ev.ev_txid >= v_txlo and ev.ev_txid < v_txhi
             and ev.ev_id > st.st_acked_to and ev.ev_id <= v_lim$wrows$ || v_mine || $wrows$
          union all
          $wrows$ || v_from || $wrows$
             and cardinality(v_txids) > 1 and ev.ev_txid = any(v_txids)
             and ev.ev_id > st.st_acked_to and ev.ev_id <= v_lim$wrows$ || v_mine || $wrows$) u
           order by u.ev_id
           limit i_max + 1)$wrows$;
    -- How a chunk is read and returned, written once and put in twice
    -- (at <read rows> and <read wrows>): over <rows>, and over <wrows>.
    v_read constant text := $read$        perform set_config('pgque.chunk_end', '', true);
        return query
        select x.ev_id, st.st_batch, x.ev_type, x.ev_data, coalesce(x.ev_retry, 0), x.ev_time,
               x.ev_extra1, x.ev_extra2, x.ev_extra3, x.ev_extra4/*<epoch>*/
          from (select e.*,
                       row_number() over w as rn,
                       count(*) over w as cnt,
                       sum(octet_length(e.ev_data)) over w as bytes
                  from /*<rows>*/ e
                window w as (order by e.ev_id rows between unbounded preceding and unbounded following)) x
         where x.rn <= i_max
           and case when coalesce(x.bytes, 0) > v_budget
                    then x.rn = 1 and set_config('pgque.chunk_end', 'over', true) is null
                    else x.rn < least(x.cnt, i_max)
                         or (x.rn = least(x.cnt, i_max)
                             and set_config('pgque.chunk_end', x.ev_id::text || case when x.cnt <= i_max then ' all' else ' more' end,
                                            true) is not null)
               end
         order by x.ev_id;
        if not found and current_setting('pgque.chunk_end') = 'over' then
            -- More bytes than the budget in the next max+1 events: cut the
            -- chunk by a running sum, the last row within the budget (at
            -- least one row) looking at the size of the next.
            return query
            select x.ev_id, st.st_batch, x.ev_type, x.ev_data, coalesce(x.ev_retry, 0), x.ev_time,
                   x.ev_extra1, x.ev_extra2, x.ev_extra3, x.ev_extra4/*<epoch>*/
              from (select e.*,
                           row_number() over w as rn,
                           sum(octet_length(e.ev_data)) over w as run,
                           lead(e.ev_id) over w as nxt,
                           lead(octet_length(e.ev_data)) over w as nxt_len
                      from /*<rows>*/ e
                    window w as (order by e.ev_id rows unbounded preceding)) x
             where x.rn <= i_max and (x.rn = 1 or coalesce(x.run, 0) <= v_budget)
               and (not (x.rn <= i_max and (x.rn = 1 or coalesce(x.run, 0) <= v_budget)
                         and (x.rn = i_max or x.nxt is null or coalesce(x.run, 0) + coalesce(x.nxt_len, 0) > v_budget))
                    or set_config('pgque.chunk_end', x.ev_id::text || case when x.nxt is null then ' all' else ' more' end,
                                  true) is not null)
             order by x.ev_id;
        end if;
$read$;
    v_body constant text := replace(replace(replace(replace($body$
#variable_conflict use_column
declare
/*<declare>*/    v_sub    integer;
    v_queue  integer;
    st       pgque.sub_state;
    v_dirty  boolean := false;
    v_next   bigint;
    v_prev   pg_snapshot;
    v_cur    pg_snapshot;
    v_xip    xid8[];
    v_empty  integer := 0;
    v_budget bigint := pgque._chunk_bytes();
    v_end    text;
    v_last   bigint;
    v_all    boolean;
    v_lim    bigint;
    v_width  bigint;
    v_seq    bigint;
    v_span   bigint;
    v_txlo   xid8;
    v_txhi   xid8;
    v_txids  xid8[];
    v_reader text;
begin
/*<entry>*/    if i_max is null then
        raise exception using errcode = '22004', message = 'max must not be NULL';
    end if;
    if i_max < 1 or i_max > 100000 then
        raise exception using errcode = 'PQ011', message = format('max must be between 1 and 100000, not %s', i_max);
    end if;
    select s1.sub_id, s1.sub_queue into v_sub, v_queue
      from pgque.subscription s1 join pgque.queue q on q.queue_id = s1.sub_queue
     where q.queue_name = i_queue and s1.sub_name = i_sub;
    if not found then
        perform pgque._subscription(i_queue, i_sub); -- raises the right error
    end if;
    if i_ack_batch is null then
        -- A poll with nothing to do reads and locks nothing more.
        st := pgque._sub_state(v_sub);
        if st.st_batch is null and not exists (
            select 1 from pgque.tick t where t.tick_queue = v_queue and t.tick_id > st.st_last_tick) then
/*<done>*/            return;
        end if;
    end if;
    st := pgque._lock_sub(v_sub);
    if i_ack_batch is not null then
        if st.st_batch is distinct from i_ack_batch then
            raise exception using errcode = 'PQ020',
                message = format('batch %s is not open for consumer %L of queue %L', i_ack_batch, i_sub, i_queue);
        end if;
        if st.st_delivered_to is not null then
            if st.st_delivered_all then
                st.st_last_tick := st.st_next_tick;
                st.st_next_tick := null;
                st.st_batch := null;
                st.st_acked_to := null;
            else
                st.st_acked_to := st.st_delivered_to;
            end if;
            st.st_delivered_to := null;
            st.st_delivered_all := false;
            v_dirty := true;
        end if;
    end if;
    loop
        if st.st_batch is null then
            -- A sealed subscription (an online resize) ends at its seal;
            -- read under the lock, so a seal committed meanwhile counts.
            v_next := pgque._batch_end(v_queue, st.st_last_tick, i_span,
                                       (select s2.sub_until_tick from pgque.subscription s2 where s2.sub_id = v_sub));
            if v_next is null then
                exit;
            end if;
            st.st_next_tick := v_next;
            st.st_batch := nextval('pgque.batch_id_seq') * 1048576 + v_sub;
            st.st_acked_to := null;
            st.st_delivered_to := null;
            st.st_delivered_all := false;
            v_dirty := true;
        end if;
        -- Both ticks of the batch in one statement (a flip may hold a tick
        -- in both generations for a moment: any copy will do), and the
        -- events sent between them (the size estimate the reader's choice
        -- below goes by).
        select p.tick_snapshot, c.tick_snapshot, c.tick_event_seq - p.tick_event_seq
          into v_prev, v_cur, v_span
          from (select t.tick_snapshot, t.tick_event_seq from pgque.tick t
                 where t.tick_queue = v_queue and t.tick_id = st.st_last_tick limit 1) p,
               (select t.tick_snapshot, t.tick_event_seq from pgque.tick t
                 where t.tick_queue = v_queue and t.tick_id = st.st_next_tick limit 1) c;
        if v_prev is null or v_cur is null then
            raise exception using errcode = 'XX000',
                message = format('ticks %s/%s of batch %s are missing', st.st_last_tick, st.st_next_tick, st.st_batch);
        end if;
        -- The running transactions, and 0 (no transaction's id): a list
        -- the planner cannot prove empty. "ev_txid = any('{}')" is a
        -- condition it proves false, and a false condition implies any
        -- partial index's predicate, so it may read that part from the
        -- dedup key index: every event with a key in the table. When 0 is
        -- all there is (no transaction was running: the common case),
        -- "cardinality(v_xip) > 1" folds to false in the custom plan and
        -- drops that scan before it is planned (and so for v_txids).
        v_xip := array(select pg_snapshot_xip(v_prev)) || '0'::xid8;
        -- The batch's next max+1 rows past the acknowledged ones (<rows>,
        -- above), returned in ev_id order up to max. One window over that set, whole, gives
        -- each row its number, and every row the set's count and bytes:
        -- the row after the chunk (number max+1) says whether the chunk
        -- reaches the batch's end, and the chunk's last row notes its ev_id
        -- and that fact in the transaction-local setting pgque.chunk_end
        -- as it goes out, so the rows are read, cut and returned by one
        -- plan-cached statement with no second pass (a CTE to count them
        -- costs about as much as the read itself). A running sum per row,
        -- or lead() to look at the next one, would cost a fifth more
        -- server time per event; the byte budget only needs them when the
        -- set's bytes pass it, and then this statement returns nothing,
        -- says so in the setting, and the one below cuts the chunk. The
        -- quals are complete on their own (each row's test implies it is
        -- in the chunk), whatever order the planner gives them; CASE fixes
        -- the order of the two tests.
        -- A large batch (see "Large batches" in docs/design.md): past its
        -- first chunk, the next chunk is looked for in a window of ev_ids
        -- after the acknowledged ones, whose rows the (ev_txid, ev_id)
        -- index yields without reading the batch's other rows, so every
        -- chunk costs its own rows and not the batch's remaining ones. The
        -- window stands only when it holds the next max+1 rows: its
        -- (max+1)th row's ev_id becomes v_lim, so the window's statements
        -- below return exactly the rows the unbounded ones would. A window
        -- that holds fewer grows fourfold, and once it would reach the
        -- batch's end tick's event sequence (no ev_id of the batch is
        -- past it), the unbounded statements read the chunk instead: the
        -- last chunk, and every chunk of a small batch. Rows of a slot
        -- are one in nslots of the window's.
        v_lim := null;
        if st.st_acked_to is not null then
            v_seq := (select t.tick_event_seq from pgque.tick t
                       where t.tick_queue = v_queue and t.tick_id = st.st_next_tick limit 1);
            v_width := (i_max + 1 + (i_max + 1) / 4) * greatest(coalesce(i_nslots, 1), 1);
            if st.st_acked_to + v_width < v_seq then
                v_txlo := pg_snapshot_xmax(v_prev);
                v_txhi := pg_snapshot_xmax(v_cur);
                if v_txhi::text::bigint - v_txlo::text::bigint <= 256 then
                    v_txids := array(select x from unnest(v_xip) x where pg_visible_in_snapshot(x, v_cur)
                                     union all
                                     select g::text::xid8
                                       from generate_series(v_txlo::text::bigint, v_txhi::text::bigint - 1) g
                                      where pg_visible_in_snapshot(g::text::xid8, v_cur));
                    v_txhi := v_txlo;
                else
                    v_txids := array(select x from unnest(v_xip) x where pg_visible_in_snapshot(x, v_cur));
                end if;
                while st.st_acked_to + v_width < v_seq loop
                    v_lim := st.st_acked_to + v_width;
                    v_lim := (select w.ev_id from /*<wrows>*/ w order by w.ev_id offset i_max limit 1);
                    exit when v_lim is not null;
                    v_width := v_width * 4;
                end loop;
            end if;
        end if;
        -- A chunk of up to about 256 events (by max, or by the events
        -- sent between the batch's ticks, a slot's share of them), the
        -- whole chunk read by one statement, goes through the queue's
        -- reader (see "Readers" above): the same statement, planned once
        -- per session instead of at every chunk. Larger chunks are read
        -- here: their plan costs less than handing their rows over from a
        -- second function. The estimate only picks the way; both read the
        -- same rows.
        if v_lim is null and v_reader is null then
            v_reader := '';
            if i_max <= 256 or v_span / greatest(coalesce(i_nslots, 1), 1) <= 256 then
                v_reader := format('_read_%s_%s', v_queue, coalesce(i_nslots, 1));
                if to_regproc('pgque.' || v_reader) is null then
                    v_reader := ''; -- not made yet (see _make_readers)
                else
                    v_reader := format('select r.*/*<epoch param>*/ from pgque.%I($1, $2, $3, $4, $5, $6, $7, $8) r',
                                       v_reader);
                end if;
            end if;
        end if;
        if v_lim is null and v_reader <> '' then
            return query execute v_reader using st, v_prev, v_cur, v_xip, v_sub, i_slot, i_max, v_budget/*<epoch>*/;
        elsif v_lim is null then
/*<read rows>*/        else
/*<read wrows>*/        end if;
        if found then
            v_end := current_setting('pgque.chunk_end');
            v_last := split_part(v_end, ' ', 1)::bigint;
            v_all := split_part(v_end, ' ', 2) = 'all';
            if st.st_delivered_to is distinct from v_last or st.st_delivered_all is distinct from v_all then
                st.st_delivered_to := v_last;
                st.st_delivered_all := v_all;
                v_dirty := true;
            end if;
            exit;
        end if;
        -- Nothing (left) for this consumer in the batch: finish it, go on.
        st.st_last_tick := st.st_next_tick;
        st.st_next_tick := null;
        st.st_batch := null;
        st.st_acked_to := null;
        st.st_delivered_to := null;
        st.st_delivered_all := false;
        v_dirty := true;
        v_empty := v_empty + 1;
        exit when v_empty >= 100;
    end loop;
    -- A redelivery of the same chunk writes nothing.
    if v_dirty then
        perform pgque._put_state(st);
    end if;
/*<done>*/end;
$body$, '/*<read rows>*/', v_read), '/*<read wrows>*/', replace(v_read, '/*<rows>*/', '/*<wrows>*/')),
        '/*<rows>*/', v_rows), '/*<wrows>*/', v_wrows);
    -- Without a lease: no epoch column, nothing to do when done.
    v_plain constant text := replace(replace(replace(v_body, '/*<epoch>*/', ''), '/*<epoch param>*/', ''), '/*<done>*/', '');
begin
    execute format($ddl$
create or replace function pgque._deliver_raw(i_queue text, i_sub text, i_max integer,
                                              i_slot integer, i_nslots integer, i_span bigint,
                                              i_ack_batch bigint default null)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as %L$ddl$, replace(replace(v_plain, '/*<declare>*/', ''), '/*<entry>*/', ''));

    execute format($ddl$
create or replace function pgque.receive_raw(i_queue text, i_consumer text, i_max integer default 100,
                                             i_ack_batch bigint default null)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as %L$ddl$, replace(replace(v_plain,
        '/*<declare>*/', $decl$    i_sub    text := i_consumer;
    i_slot   integer;
    i_nslots integer;
    i_span   bigint := i_max;
$decl$),
        '/*<entry>*/', $entry$    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._not_null('consumer name', i_consumer);
    perform pgque._refuse_slot(i_consumer);
$entry$));

    -- The body, markers in, for the partition layer's entry point
    -- (receive_partitioned_raw, in partition/functions/
    -- pgque.receive_partitioned.sql).
    execute format($ddl$
create or replace function pgque._deliver_raw_body()
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as %L$ddl$, 'select ' || quote_literal(v_body));

    -- What a reader runs (see below): the chunk read over <rows>, no epoch
    -- column; v_queue and i_nslots are put in as numbers by _make_reader.
    execute format($ddl$
create or replace function pgque._reader_src()
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as %L$ddl$, 'select ' || quote_literal(replace(replace(v_read, '/*<rows>*/', v_rrows), '/*<epoch>*/', '')));
end
$deliver_raw$;

-- Readers. The statement that reads a chunk names the queue's partitions
-- by a parameter (the queue id) and the routing expression by another (the
-- slot count), so a plan made for one call serves no other: a generic plan
-- would hold every queue's partitions and could use no routing index. The
-- entry points therefore plan it at every chunk, and for a chunk of a few
-- events that planning was most of the call (0.4 ms of about 0.8 ms per
-- receive_partitioned_raw). A reader, pgque._read_<queue id>_<N>, is the
-- same statement with the queue id and N written in as numbers: plan-time
-- pruning keeps its partitions to the queue's own, N matches the routing
-- index, and its plan is made once per session (a generic plan, forced:
-- the custom plans would look cheaper, since they drop the running-xid
-- scan when no transaction ran, and cost a planning each). It plans
-- without sequential scans: a plan cached while a table is empty would
-- otherwise keep scanning it whole as it fills. The entry points call it
-- with EXECUTE, which plans only the call, and only for chunks of up to
-- 256 events (above, the rows cost more to hand over from a second
-- function than the plan costs). _make_reader makes one when a queue gets
-- its first consumer of that N (subscribe, subscribe_slot, resize_slots)
-- and the install remakes every existing one, so that a reader is always
-- the statement of the installed version; until one exists the entry
-- points read inline. Readers are not granted to any role.

-- _make_reader(queue_id, nslots, replace): creates the queue's reader for
-- nslots (1 for plain consumers), or replaces it when replace is true. Two
-- sessions making the same reader at once: the second finds it made. The
-- SQL text holds only the two integers and the template.
create or replace function pgque._make_reader(i_queue_id integer, i_nslots integer, i_replace boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_name text := format('_read_%s_%s', i_queue_id, i_nslots);
begin
    if i_queue_id is null or i_nslots is null or i_nslots < 1 then
        raise exception using errcode = '22023', message = format('no reader for queue %s and %s slots', i_queue_id, i_nslots);
    end if;
    if not i_replace and to_regproc('pgque.' || v_name) is not null then
        return;
    end if;
    begin
        execute format($ddl$
create or replace function pgque.%I(st pgque.sub_state, v_prev pg_catalog.pg_snapshot, v_cur pg_catalog.pg_snapshot,
                                    v_xip pg_catalog.xid8[], v_sub integer, i_slot integer, i_max integer,
                                    v_budget bigint)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as %L$ddl$,
            v_name,
            E'\n#variable_conflict use_column\nbegin\n'
                || replace(replace(pgque._reader_src(), 'v_queue', i_queue_id::text), 'i_nslots', i_nslots::text)
                || E'end;\n');
    exception when unique_violation then
        return; -- made by a concurrent session
    end;
    execute format('revoke all on function pgque.%I(pgque.sub_state, pg_catalog.pg_snapshot, pg_catalog.pg_snapshot, '
                   'pg_catalog.xid8[], integer, integer, integer, bigint) from public', v_name);
end;
$$;

-- _readers(): the readers that exist: function, queue id, N.
create or replace function pgque._readers()
returns table (fn regprocedure, queue_id integer, nslots integer) language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select p.oid::regprocedure, m[1]::integer, m[2]::integer
      from pg_catalog.pg_proc p
      cross join lateral pg_catalog.regexp_match(p.proname, '^_read_([0-9]+)_([0-9]+)$') m
     where p.pronamespace = 'pgque'::regnamespace and m is not null
$$;

-- _maint_readers(): drops the readers of queues that no longer exist (a
-- 'maint' hook). Returns how many it dropped.
create or replace function pgque._maint_readers()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r   record;
    v_n integer := 0;
begin
    for r in
        select x.fn from pgque._readers() x
         where not exists (select 1 from pgque.queue q where q.queue_id = x.queue_id)
    loop
        execute format('drop function if exists %s', r.fn);
        v_n := v_n + 1;
    end loop;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'readers', 'pgque._maint_readers()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- Every reader of the install is made again from this version's statement.
select pgque._make_reader(x.queue_id, x.nslots, true)
  from (select queue_id, 1 as nslots from pgque.queue
        union
        select r.queue_id, r.nslots from pgque._readers() r
         where exists (select 1 from pgque.queue q where q.queue_id = r.queue_id)) x;

-- _as_messages(queue, subscription, max, slot, nslots, span): the chunk
-- _deliver_raw hands out, with payloads as jsonb, for the functions whose
-- contract is jsonb (receive, receive_partitioned). Data that jsonb cannot
-- hold (only insert_event can store it: text that is not JSON, a \u0000
-- escape, a number out of range, nesting past the stack limit) comes as a
-- JSON string of the stored text: the chunk is then read again, and its
-- state appended again, in place of the failed attempt (one subtransaction
-- per chunk, none per row). The chunk is collected before it is returned,
-- so a failed attempt returns nothing.
create or replace function pgque._as_messages(i_queue text, i_sub text, i_max integer,
                                              i_slot integer, i_nslots integer, i_span bigint)
returns pgque.message[] language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_rows pgque.message[];
begin
    begin
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, d.payload::jsonb, d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._deliver_raw(i_queue, i_sub, i_max, i_slot, i_nslots, i_span) d);
    exception when data_exception or program_limit_exceeded then
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, pgque._payload(d.payload), d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._deliver_raw(i_queue, i_sub, i_max, i_slot, i_nslots, i_span) d);
    end;
    return v_rows;
end;
$$;
