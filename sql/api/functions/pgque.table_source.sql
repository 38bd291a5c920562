-- Trigger-sourced events: attach_table makes every INSERT/UPDATE/DELETE on
-- a table emit one event per row into a queue, in the writing transaction,
-- with a chosen column as partition key.
--
-- The event: ev_type 'insert', 'update' or 'delete'; payload the row as
-- JSON (to_jsonb of the new row, the old row for delete), restricted to the
-- chosen columns; partition key the key column's value as text (NULL key
-- when NULL); ev_extra2 the table as schema.table; for an update ev_extra3
-- is the JSON array of the columns whose values changed. An UPDATE that
-- changes the key emits a 'delete' of the old row on the old key and then an
-- 'insert' of the new row on the new key, both with ev_extra3 = 'moved', so
-- each key's stream stays consistent on its own. TRUNCATE is refused with
-- PQ060 unless 'truncate' is one of the operations, which emits one
-- 'truncate' event with the NULL key.
--
-- Mechanism. An attachment of table T to queue Q (id N) is three triggers
-- on T calling two generic functions, the attachment in their arguments;
-- no SQL text and no function body is built from a table or column name:
--   pgque_qN           AFTER row: _table_source_capture(N, key column,
--                      skip_unchanged, payload mode, columns...), SECURITY
--                      INVOKER. It turns the row into the event(s) with the
--                      writer's own rights (to_jsonb and the key column's
--                      cast to text evaluate the table's types, whose casts
--                      the table's owner may define) and hands them over as
--                      jsonb text in the transaction-local setting
--                      pgque.src_N.
--   pgque_qN_emit      AFTER row [WHEN condition]: _table_source_emit(N),
--                      SECURITY DEFINER. Fires right after pgque_qN for the
--                      same row (triggers fire in name order), checks that
--                      T is attached to Q and that the handed-over text is
--                      this row's, and writes the events. It evaluates
--                      nothing of the table's: only text and jsonb.
--   pgque_qN_truncate  BEFORE TRUNCATE: _table_source_emit(N).
-- A trigger function cannot be called except as a trigger, and creating a
-- trigger needs EXECUTE on it (pgque_admin only), so the writing half is
-- reachable only through a write to an attached table.

-- Functions of earlier versions: the generator of per-table trigger
-- functions, and the privileged step that called it (now
-- _table_source_record, returning the queue id).
drop function if exists pgque._table_source_generate(text, regclass, text, text[], text[], text[], text, boolean, boolean);
drop function if exists pgque._table_source_define(text, regclass, text, text[], text[], text[], text, boolean);

-- _table_source_capture(): the row trigger pgque_q<queue_id>. Arguments
-- (TG_ARGV): queue id, key column, skip_unchanged ('true'/'false'),
-- payload mode ('all', 'keep' or 'exclude'), then the mode's columns.
-- SECURITY INVOKER: runs as the role writing the table, reads nothing of
-- pgque (the writer needs no grant). Sets pgque.src_<queue_id> (local) to
-- {"r": table oid, "o": TG_OP, "e": [events]}, each event {"t": type,
-- "k": key, "d": payload, "x": extra3}; an empty list when skip_unchanged
-- drops an update. The key is the column's value cast to text by dynamic
-- SQL with the name quoted by %I, as the writer.
create or replace function pgque._table_source_capture()
returns trigger language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_key  text := tg_argv[1];
    v_mode text := tg_argv[3];
    v_cols text[] := tg_argv[4:];
    v_new  jsonb;
    v_old  jsonb;
    v_knew text;
    v_kold text;
    v_evs  jsonb;
begin
    -- The rows as JSON restricted to the chosen columns (NEW is NULL for a
    -- delete, OLD for an insert). Plain expressions where they do, since
    -- PL/pgSQL evaluates those without a query; keeping columns takes one
    -- query for both rows.
    if v_mode = 'all' then
        v_new := to_jsonb(new);
        v_old := to_jsonb(old);
    elsif v_mode = 'exclude' then
        v_new := to_jsonb(new) - v_cols;
        v_old := to_jsonb(old) - v_cols;
    else
        select (array_agg(p.j) filter (where r.n = 1))[1], (array_agg(p.j) filter (where r.n = 2))[1]
          into v_new, v_old
          from (values (1, to_jsonb(new)), (2, to_jsonb(old))) r (n, j)
          cross join lateral (select coalesce(jsonb_object_agg(e.key, e.value), '{}')
                                from jsonb_each(r.j) e where e.key = any (v_cols)) p (j)
         where r.j is not null;
    end if;
    if tg_op = 'INSERT' then
        execute format('select ($1).%I::text', v_key) into v_knew using new;
        v_evs := jsonb_build_array(jsonb_build_object('t', 'insert', 'k', v_knew, 'd', v_new));
    elsif tg_op = 'DELETE' then
        execute format('select ($1).%I::text', v_key) into v_kold using old;
        v_evs := jsonb_build_array(jsonb_build_object('t', 'delete', 'k', v_kold, 'd', v_old));
    else
        execute format('select ($1).%1$I::text, ($2).%1$I::text', v_key) into v_knew, v_kold using new, old;
        if v_knew is distinct from v_kold then
            v_evs := jsonb_build_array(jsonb_build_object('t', 'delete', 'k', v_kold, 'd', v_old, 'x', 'moved'),
                                       jsonb_build_object('t', 'insert', 'k', v_knew, 'd', v_new, 'x', 'moved'));
        elsif tg_argv[2]::boolean and v_new = v_old then
            v_evs := '[]';
        else
            v_evs := jsonb_build_array(jsonb_build_object('t', 'update', 'k', v_knew, 'd', v_new, 'x',
                (select coalesce(jsonb_agg(n.key order by n.key), '[]')::text
                   from jsonb_each(v_new) n where (v_old -> n.key) is distinct from n.value)));
        end if;
    end if;
    perform set_config('pgque.src_' || tg_argv[0], jsonb_build_object('r', tg_relid, 'o', tg_op, 'e', v_evs)::text, true);
    return null;
end;
$$;

-- _table_source_emit(): the row trigger pgque_q<queue_id>_emit and the
-- TRUNCATE trigger pgque_q<queue_id>_truncate. Argument: the queue id.
-- SECURITY DEFINER, search_path pinned; touches no column of the table.
-- Refuses (42501) unless the table (or a partitioned table it belongs to)
-- is attached to that queue. TRUNCATE: writes the 'truncate' event, or
-- raises PQ060. Rows: takes and clears what _table_source_capture handed
-- over for this row, refuses it (PQ064) unless it names this table and
-- operation and holds events of the types that operation can emit, and
-- inserts them into the queue's current event table. Tables: reads
-- table_source and queue; inserts into event.
create or replace function pgque._table_source_emit()
returns trigger language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_queue  integer := tg_argv[0]::integer;
    v_setting text := 'pgque.src_' || v_queue;
    v_name   text;
    v_ops    text[];
    v_part   integer;
    v_seq    regclass;
    v_qname  text;
    v_doc    jsonb;
    v_ev     jsonb;
    v_n      integer;
    v_types  text[];
begin
    select ts.ts_table_name, ts.ts_operations, pgque._part(q.queue_id, q.queue_cur_table), q.queue_event_seq, q.queue_name
      into v_name, v_ops, v_part, v_seq, v_qname
      from pgque.table_source ts join pgque.queue q on q.queue_id = ts.ts_queue
     where ts.ts_queue = v_queue and ts.ts_table = tg_relid;
    if not found then
        -- A partition of an attached partitioned table carries its clones
        -- of the triggers.
        select ts.ts_table_name, ts.ts_operations, pgque._part(q.queue_id, q.queue_cur_table), q.queue_event_seq, q.queue_name
          into v_name, v_ops, v_part, v_seq, v_qname
          from pgque.table_source ts join pgque.queue q on q.queue_id = ts.ts_queue
         where ts.ts_queue = v_queue and ts.ts_table in (select a.relid from pg_partition_ancestors(tg_relid) a);
        if not found then
            raise exception using errcode = '42501',
                message = format('table %s is not attached to queue id %s: pgque''s trigger functions write only for attached tables',
                                 tg_relid::regclass, v_queue);
        end if;
    end if;
    if tg_op = 'TRUNCATE' then
        if not 'truncate' = any (v_ops) then
            raise exception using errcode = 'PQ060',
                message = format('%s is attached to queue %s: TRUNCATE would bypass its events; detach it first, or attach with operation truncate',
                                 v_name, v_qname);
        end if;
        -- This trigger fires before the table is touched, so it takes the
        -- transaction's id before the event's (see _tick_due); the row
        -- triggers fire after the row is written, which took it.
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra2)
        values (pgque._next_ev_id(v_seq), v_part, 'truncate',
                jsonb_build_object('table', v_name)::text, v_name);
        return null;
    end if;
    v_doc := nullif(current_setting(v_setting, true), '')::jsonb;
    perform set_config(v_setting, '', true);
    v_types := case tg_op when 'INSERT' then '{insert}' when 'DELETE' then '{delete}' else '{update,delete,insert}' end;
    if v_doc ->> 'r' = tg_relid::text and v_doc ->> 'o' = tg_op and jsonb_typeof(v_doc -> 'e') = 'array' then
        v_ev := v_doc -> 'e' -> 0;
        if jsonb_array_length(v_doc -> 'e') = 1 then
            -- The common case, one event: a plain INSERT of its values.
            if (v_ev ->> 't') = any (v_types) and jsonb_typeof(v_ev -> 'd') = 'object' then
                insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
                values (nextval(v_seq), v_part, v_ev ->> 't', (v_ev -> 'd')::text, v_ev ->> 'k', v_name, v_ev ->> 'x');
                return null;
            end if;
        else
            -- None or two (a move): one statement, in their order; an event
            -- of the wrong shape is left out, and then refused below.
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
            select nextval(v_seq), v_part, e ->> 't', (e -> 'd')::text, e ->> 'k', v_name, e ->> 'x'
              from jsonb_array_elements(v_doc -> 'e') e
             where (e ->> 't') = any (v_types) and jsonb_typeof(e -> 'd') = 'object';
            get diagnostics v_n = row_count;
            if v_n = jsonb_array_length(v_doc -> 'e') then
                return null;
            end if;
        end if;
    end if;
    raise exception using errcode = 'PQ064',
        message = format('%s attached to queue %s: its trigger pgque_q%s did not hand this row over (dropped, disabled or tampered with); attach the table again',
                         v_name, v_qname, v_queue);
    return null;
end;
$$;

-- _table_source_record(queue, table, key_column, operations, columns,
-- exclude_columns, when_condition, skip_unchanged): attach_table's
-- privileged step. Validates the attachment (the session user must hold
-- the TRIGGER privilege on the table; columns must exist) and records it
-- in pgque.table_source, replacing an earlier attachment of the table to
-- the queue. Builds no SQL. Returns the queue id.
create or replace function pgque._table_source_record(
    i_queue text, i_table regclass, i_key_column text, i_operations text[],
    i_columns text[], i_exclude text[], i_when text, i_skip_unchanged boolean)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q       pgque.queue := pgque._queue(i_queue);
    v_kind  "char";
    v_nsp   name;
    v_tname text;
    v_col   text;
begin
    if i_table is null or i_key_column is null or i_operations is null or i_skip_unchanged is null then
        raise exception using errcode = '22004', message = 'table, key column, operations and skip_unchanged must not be NULL';
    end if;
    select c.relkind, n.nspname, format('%I.%I', n.nspname, c.relname) into v_kind, v_nsp, v_tname
      from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where c.oid = i_table;
    if v_kind not in ('r', 'p') then
        raise exception using errcode = 'PQ011', message = format('%s is not a table', i_table);
    end if;
    if v_nsp = 'pgque' then
        raise exception using errcode = 'PQ011', message = 'pgque''s own tables cannot be attached';
    end if;
    if not pg_catalog.has_table_privilege(session_user, i_table, 'TRIGGER') then
        raise exception using errcode = '42501',
            message = format('role %s may not create triggers on %s', session_user, v_tname);
    end if;
    foreach v_col in array array[i_key_column] || coalesce(i_columns, '{}') || coalesce(i_exclude, '{}') loop
        if v_col is null or not exists (select 1 from pg_catalog.pg_attribute
                                          where attrelid = i_table and attname = v_col
                                            and attnum > 0 and not attisdropped) then
            raise exception using errcode = '42703',
                message = format('column %s does not exist in %s', coalesce(quote_ident(v_col), 'NULL'), v_tname);
        end if;
    end loop;
    if i_columns is not null and i_exclude is not null then
        raise exception using errcode = 'PQ011', message = 'pass columns to keep or columns to leave out, not both';
    end if;
    insert into pgque.table_source (ts_queue, ts_table, ts_table_name, ts_key_column, ts_operations,
                                    ts_columns, ts_exclude, ts_skip_unchanged, ts_when)
    values (q.queue_id, i_table, v_tname, i_key_column, i_operations, i_columns, i_exclude,
            i_skip_unchanged, i_when)
    on conflict (ts_queue, ts_table) do update set
        ts_table_name = excluded.ts_table_name, ts_key_column = excluded.ts_key_column,
        ts_operations = excluded.ts_operations, ts_columns = excluded.ts_columns,
        ts_exclude = excluded.ts_exclude, ts_skip_unchanged = excluded.ts_skip_unchanged,
        ts_when = excluded.ts_when, ts_attached = now();
    return q.queue_id;
end;
$$;

-- _table_source_unhook(queue_id, table): drops the triggers of the queue's
-- attachment from the table (those that exist). SECURITY INVOKER: the
-- caller must own the table. Names are quoted with %I where the statement
-- is executed. Returns 1.
create or replace function pgque._table_source_unhook(i_queue_id integer, i_table regclass)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_nsp  name;
    v_rel  name;
    v_trg  text;
begin
    if i_queue_id is null or i_table is null then
        raise exception using errcode = '22004', message = 'queue id and table must not be NULL';
    end if;
    select n.nspname, c.relname into v_nsp, v_rel
      from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = i_table;
    for v_trg in select g.tgname from pg_trigger g
                  where g.tgrelid = i_table and not g.tgisinternal and g.tgparentid = 0
                    and g.tgname in ('pgque_q' || i_queue_id, 'pgque_q' || i_queue_id || '_emit',
                                     'pgque_q' || i_queue_id || '_truncate') loop
        execute format('drop trigger %I on %I.%I', v_trg, v_nsp, v_rel);
    end loop;
    return 1;
end;
$$;

-- _table_source_hook(queue_id, table, operations, key_column, columns,
-- exclude_columns, when_condition, skip_unchanged): (re)creates the
-- triggers of an attachment (see Mechanism above), after dropping the
-- queue's earlier ones. SECURITY INVOKER: the caller needs the TRIGGER
-- privilege on the table and EXECUTE on the trigger functions; the
-- condition is parsed with the caller's rights. Names and arguments are
-- quoted with %I and %L where the statement is executed. Returns 1.
create or replace function pgque._table_source_hook(
    i_queue_id integer, i_table regclass, i_operations text[], i_key_column text,
    i_columns text[], i_exclude text[], i_when text, i_skip_unchanged boolean)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_nsp     name;
    v_rel     name;
    v_trg     text := 'pgque_q' || i_queue_id;
    v_row_ops text;
    v_args    text[];
begin
    if i_operations is null or i_key_column is null or i_skip_unchanged is null then
        raise exception using errcode = '22004', message = 'operations, key column and skip_unchanged must not be NULL';
    end if;
    if i_operations = '{}' or not i_operations <@ array['delete', 'insert', 'truncate', 'update'] then
        raise exception using errcode = 'PQ011',
            message = format('operations must be a non-empty list of insert, update, delete, truncate, not %L', i_operations);
    end if;
    perform pgque._table_source_unhook(i_queue_id, i_table);
    select n.nspname, c.relname into v_nsp, v_rel
      from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = i_table;
    select string_agg(upper(o), ' or ') into v_row_ops from unnest(i_operations) o where o <> 'truncate';
    v_args := array[i_queue_id::text, i_key_column, i_skip_unchanged::text,
                    case when i_columns is not null then 'keep' when i_exclude is not null then 'exclude' else 'all' end]
              || coalesce(i_columns, i_exclude, '{}');
    if v_row_ops is not null then
        execute format('create trigger %I after %s on %I.%I for each row execute function pgque._table_source_capture(%s)',
                       v_trg, v_row_ops, v_nsp, v_rel, (select string_agg(format('%L', a), ', ') from unnest(v_args) a));
        execute format('create trigger %I after %s on %I.%I for each row %s execute function pgque._table_source_emit(%L)',
                       v_trg || '_emit', v_row_ops, v_nsp, v_rel,
                       case when i_when is null then '' else 'when (' || i_when || ')' end, i_queue_id);
    end if;
    execute format('create trigger %I before truncate on %I.%I for each statement execute function pgque._table_source_emit(%L)',
                   v_trg || '_truncate', v_nsp, v_rel, i_queue_id);
    return 1;
end;
$$;

-- attach_table(queue, source_table, key_column[, operations, columns,
-- exclude_columns, when_condition, skip_unchanged]): makes every row the
-- table's writers insert, update or delete emit an event into queue, keyed
-- by key_column. operations: any of insert, update, delete, truncate
-- (default the first three); columns: keep only these in the payload;
-- exclude_columns: leave these out; when_condition: an SQL boolean
-- expression over NEW/OLD, exactly as in CREATE TRIGGER ... WHEN (it is
-- parsed with search_path = pg_catalog, so qualify your own functions);
-- skip_unchanged: emit nothing for an update that changes no kept column.
-- Re-attaching replaces the previous options. SECURITY INVOKER: the caller
-- needs the TRIGGER privilege on the table (owner) and pgque_admin; the
-- condition is the caller's own SQL, run with the caller's rights.
-- Creates triggers pgque_q<queue_id>, pgque_q<queue_id>_emit (rows) and
-- pgque_q<queue_id>_truncate on the table. Returns 1.
create or replace function pgque.attach_table(
    queue text, source_table regclass, key_column text,
    operations text[] default array['insert', 'update', 'delete'],
    columns text[] default null, exclude_columns text[] default null,
    when_condition text default null, skip_unchanged boolean default true)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue      alias for $1;
    i_table      alias for $2;
    i_key_column alias for $3;
    i_operations alias for $4;
    i_columns    alias for $5;
    i_exclude    alias for $6;
    i_when       alias for $7;
    i_skip       alias for $8;
    v_ops        text[];
    v_queue_id   integer;
begin
    select array_agg(distinct lower(o) order by lower(o)) into v_ops from unnest(i_operations) o;
    if v_ops is null or not v_ops <@ array['delete', 'insert', 'truncate', 'update'] or array_position(v_ops, null) is not null then
        raise exception using errcode = 'PQ011',
            message = format('operations must be a non-empty list of insert, update, delete, truncate, not %L', i_operations);
    end if;
    if i_when is not null and btrim(i_when) = '' then
        raise exception using errcode = 'PQ011', message = 'when_condition must not be empty; pass NULL for none';
    end if;
    v_queue_id := pgque._table_source_record(i_queue, i_table, i_key_column, v_ops, i_columns, i_exclude, i_when, i_skip);
    return pgque._table_source_hook(v_queue_id, i_table, v_ops, i_key_column, i_columns, i_exclude, i_when, i_skip);
end;
$$;

-- _table_source_trigger_name(queue): the name of queue's triggers on an
-- attached table, pgque_q<queue_id>. Raises PQ001 for an unknown queue.
create or replace function pgque._table_source_trigger_name(i_queue text)
returns text language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$ select 'pgque_q' || (pgque._queue(i_queue)).queue_id $$;

-- _table_source_forget(queue, table): after the table's triggers are gone,
-- drops the attachment record. Raises PQ061 when the table is not attached
-- to the queue, PQ062 while its triggers still exist. Returns 1.
create or replace function pgque._table_source_forget(i_queue text, i_table regclass)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    delete from pgque.table_source where ts_queue = q.queue_id and ts_table = i_table;
    if not found then
        raise exception using errcode = 'PQ061', message = format('%s is not attached to queue %s', i_table, i_queue);
    end if;
    return 1;
end;
$$;

-- detach_table(queue, source_table): removes the triggers attach_table
-- made, so the table's writes emit nothing more (events already sent
-- stay). SECURITY INVOKER: the caller must own the table and hold
-- pgque_admin. Raises PQ061 when the table is not attached. Returns 1.
create or replace function pgque.detach_table(queue text, source_table regclass)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue alias for $1;
    i_table alias for $2;
    v_trg   text := pgque._table_source_trigger_name(i_queue);
begin
    if i_table is null then
        raise exception using errcode = '22004', message = 'table must not be NULL';
    end if;
    perform pgque._table_source_unhook(substr(v_trg, length('pgque_q') + 1)::integer, i_table);
    return pgque._table_source_forget(i_queue, i_table);
end;
$$;

-- attached_tables(): every attachment: queue, table (schema.table, or
-- NULL when the table was dropped), key column and options.
create or replace function pgque.attached_tables()
returns table (queue text, source_table text, key_column text, operations text[],
               columns text[], exclude_columns text[], when_condition text,
               skip_unchanged boolean, attached timestamptz)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select q.queue_name,
           case when exists (select 1 from pg_catalog.pg_class c where c.oid = ts.ts_table) then ts.ts_table_name end,
           ts.ts_key_column::text, ts.ts_operations, ts.ts_columns, ts.ts_exclude, ts.ts_when,
           ts.ts_skip_unchanged, ts.ts_attached
      from pgque.table_source ts join pgque.queue q on q.queue_id = ts.ts_queue
     order by q.queue_name, ts.ts_table_name
$$;

-- _table_source_cleanup(): maint hook. Forgets attachments whose table was
-- dropped (its triggers went with it). Returns the number forgotten.
create or replace function pgque._table_source_cleanup()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_n  integer := 0;
begin
    delete from pgque.table_source ts
     where not exists (select 1 from pg_catalog.pg_class c where c.oid = ts.ts_table);
    get diagnostics v_n = row_count;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'table_source_cleanup', 'pgque._table_source_cleanup()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- Guard on pgque.table_source. A queue with attached tables cannot be
-- dropped (the cascade from pgque.queue deletes their rows here): the
-- tables' writes would start failing. An attachment row may only go once
-- its triggers are gone (detach_table dropped them, or the table was
-- dropped): a trigger of the table calling pgque's trigger functions with
-- the row's queue id as first argument.
create or replace function pgque._table_source_row_guard()
returns trigger language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if exists (select 1 from pg_catalog.pg_trigger g
                where g.tgrelid = old.ts_table
                  and g.tgfoid in ('pgque._table_source_capture()'::regprocedure, 'pgque._table_source_emit()'::regprocedure)
                  and split_part(encode(g.tgargs, 'escape'), E'\\000', 1) = old.ts_queue::text) then
        raise exception using errcode = 'PQ062',
            message = format('%s is still attached to queue %s: detach it first (pgque.detach_table)',
                             old.ts_table_name, (select queue_name from pgque.queue where queue_id = old.ts_queue));
    end if;
    return old;
end;
$$;

do $trg$
begin
    if not exists (select 1 from pg_catalog.pg_trigger
                    where tgrelid = 'pgque.table_source'::regclass and tgname = 'pgque_table_source_guard') then
        create trigger pgque_table_source_guard before delete on pgque.table_source
            for each row execute function pgque._table_source_row_guard();
    end if;
    -- Earlier versions dropped each attachment's own function after its row.
    if exists (select 1 from pg_catalog.pg_trigger
                where tgrelid = 'pgque.table_source'::regclass and tgname = 'pgque_table_source_drop_function') then
        drop trigger pgque_table_source_drop_function on pgque.table_source;
    end if;
end
$trg$;

-- Re-applying the install keeps each attachment's recorded table name
-- (ev_extra2) in step with a renamed table. Plain data: nothing is
-- executed.
update pgque.table_source ts set ts_table_name = format('%I.%I', n.nspname, c.relname)
  from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
 where c.oid = ts.ts_table and ts.ts_table_name is distinct from format('%I.%I', n.nspname, c.relname);

-- _table_source_legacy_when(trigger): the WHEN condition of an attachment
-- trigger of an earlier version, as PostgreSQL prints it back from its
-- parsed form (pg_get_triggerdef, as pg_dump does), or NULL for none. The
-- printed definition must be exactly CREATE TRIGGER <name> AFTER <events>
-- ON <schema>.<table> FOR EACH ROW WHEN (<condition>) EXECUTE FUNCTION
-- <function>(), each part but the condition compared with what the
-- catalog says; anything else raises XX000 rather than guess. Not granted:
-- the install calls it.
create or replace function pgque._table_source_legacy_when(i_trigger oid)
returns text language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_def  text;
    v_head text;
    v_on   text;
    v_end  text;
    v_at   integer;
begin
    select pg_get_triggerdef(g.oid),
           'CREATE TRIGGER ' || quote_ident(g.tgname) || ' AFTER',
           ' ON ' || quote_ident(n.nspname) || '.' || quote_ident(c.relname) || ' FOR EACH ROW WHEN (',
           ') EXECUTE FUNCTION ' || g.tgfoid::regproc::text || '()'
      into v_def, v_head, v_on, v_end
      from pg_trigger g join pg_class c on c.oid = g.tgrelid join pg_namespace n on n.oid = c.relnamespace
     where g.oid = i_trigger and g.tgqual is not null;
    if v_def is null then
        return null;
    end if;
    v_at := strpos(v_def, v_on);
    if left(v_def, length(v_head)) <> v_head or v_at <= length(v_head)
       or substr(v_def, length(v_head) + 1, v_at - length(v_head) - 1) !~ '^( (OR )?(INSERT|DELETE|UPDATE))+$'
       or right(v_def, length(v_end)) <> v_end or length(v_def) - length(v_end) < v_at + length(v_on) then
        raise exception using errcode = 'XX000',
            message = format('pgque: cannot read back the WHEN condition of trigger %s: %s', i_trigger, v_def);
    end if;
    return substr(v_def, v_at + length(v_on), length(v_def) - length(v_end) - v_at - length(v_on) + 1);
end;
$$;

-- Upgrade from versions that generated a SECURITY DEFINER trigger function
-- per attachment, pgque._src_<queue_id>_<table oid>() (it ran the table's
-- own casts as pgque's owner). Each attachment's triggers are replaced by
-- the generic ones with the recorded options and the WHEN condition read
-- back from the old trigger; then the old functions are dropped. Nothing
-- executed here is built from a name but with %I, and no old function is
-- called. Replacing a table's triggers needs its ownership: when the
-- installing role (pgque's owner, see preflight.sql) is not a member of an
-- attached table's owner, the install stops (42501) naming the tables,
-- rather than leave the old functions in place.
do $legacy$
declare
    r      record;
    g      record;
    v_bad  text;
    v_when text;
begin
    select string_agg(distinct format('%I.%I (owner %s)', n.nspname, c.relname, c.relowner::regrole), ', ') into v_bad
      from pg_proc p join pg_trigger t on t.tgfoid = p.oid and t.tgparentid = 0
      join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
     where p.pronamespace = 'pgque'::regnamespace and p.proname ~ '^_src_[0-9]+_[0-9]+$'
       and not pg_has_role(current_user, c.relowner, 'USAGE');
    if v_bad is not null then
        raise exception using errcode = '42501',
            message = format('pgque: tables attached by an earlier version must have their triggers replaced, and role %s does not own %s',
                             current_user, v_bad),
            hint = format('grant these tables'' owner roles to %s (the install runs as pgque''s owner, also when a superuser runs it) for the upgrade, or have the owners detach them first',
                          current_user);
    end if;
    for r in select p.proname, ts.*
               from pg_proc p join pgque.table_source ts on p.proname = format('_src_%s_%s', ts.ts_queue, ts.ts_table)
              where p.pronamespace = 'pgque'::regnamespace and p.proname ~ '^_src_[0-9]+_[0-9]+$'
                and exists (select 1 from pg_trigger t where t.tgfoid = p.oid) loop
        v_when := null;
        for g in select t.oid, t.tgname, t.tgtype, n.nspname, c.relname
                   from pg_trigger t join pg_class c on c.oid = t.tgrelid join pg_namespace n on n.oid = c.relnamespace
                  where t.tgfoid = format('pgque.%I()', r.proname)::regprocedure and t.tgparentid = 0 loop
            if g.tgtype & 1 = 1 then
                v_when := pgque._table_source_legacy_when(g.oid);
            end if;
            execute format('drop trigger %I on %I.%I', g.tgname, g.nspname, g.relname);
        end loop;
        perform pgque._table_source_hook(r.ts_queue, r.ts_table::regclass, r.ts_operations, r.ts_key_column,
                                         r.ts_columns, r.ts_exclude, v_when, r.ts_skip_unchanged);
    end loop;
    for r in select p.proname from pg_proc p
              where p.pronamespace = 'pgque'::regnamespace and p.proname ~ '^_src_[0-9]+_[0-9]+$'
                and p.pronargs = 0 and p.prorettype = 'trigger'::regtype loop
        execute format('drop function pgque.%I()', r.proname);
    end loop;
end
$legacy$;
