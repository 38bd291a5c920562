-- Layer hooks: how upper layers plug settings and maintenance into the
-- engine (see pgque.layer_hook). The engine calls a hook by the regprocedure
-- stored in the table, which only the install writes, so no caller string
-- reaches the dynamic SQL.

-- _hooks_sum(kind): runs every registered hook of kind, each called as fn()
-- returning integer, in name order, and returns the sum of what they
-- report. Not granted.
create or replace function pgque._hooks_sum(i_kind text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn regprocedure;
    v_n  integer := 0;
    v_r  integer;
begin
    for v_fn in select hook_fn from pgque.layer_hook where hook_kind = i_kind order by hook_name loop
        execute format('select %s()', v_fn::regproc) into v_r;
        v_n := v_n + coalesce(v_r, 0);
    end loop;
    return v_n;
end;
$$;

-- _maint_hooks(): runs every registered 'maint' hook (_hooks_sum). Not
-- granted: maint() calls it.
create or replace function pgque._maint_hooks()
returns integer language sql
set search_path = pg_catalog, pg_temp
as $$ select pgque._hooks_sum('maint') $$;

-- _maint_after_hooks(): runs every registered 'maint_after' hook
-- (_hooks_sum), for run_ticker's round after maint(). Granted to
-- pgque_admin, as whom that round runs (run_ticker runs as its caller), and
-- SECURITY DEFINER so that _hooks_sum need not be: it runs only the hooks
-- the install registered.
create or replace function pgque._maint_after_hooks()
returns integer language sql security definer
set search_path = pg_catalog, pg_temp
as $$ select pgque._hooks_sum('maint_after') $$;

-- _tick_hooks(queue_id, tick_id): runs every registered 'tick' hook, in
-- name order, for the tick just written (a layer that wants to say more
-- about a tick than the engine's notification does: which consumers it
-- concerns, say). Not granted: _tick_write calls it.
create or replace function pgque._tick_hooks(i_queue_id integer, i_tick_id bigint)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn regprocedure;
begin
    for v_fn in select hook_fn from pgque.layer_hook where hook_kind = 'tick' order by hook_name loop
        execute format('select %s($1, $2)', v_fn::regproc) using i_queue_id, i_tick_id;
    end loop;
end;
$$;

-- _queue_config_hook(queue_id, param, value): applies a setting owned by an
-- upper layer. Returns false when no layer knows param.
create or replace function pgque._queue_config_hook(i_queue_id integer, i_param text, i_value text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn regprocedure;
begin
    select hook_fn into v_fn from pgque.layer_hook where hook_kind = 'queue_config' and hook_name = i_param;
    if not found then
        return false;
    end if;
    execute format('select %s($1, $2)', v_fn::regproc) using i_queue_id, i_value;
    return true;
end;
$$;

-- _rotate_hold(queue_id, table_no): why a layer keeps rotation from
-- truncating a queue's table table_no now (the first 'rotate' hook, in
-- name order, that says so), or NULL when none does. Called with the
-- table locked, so its contents cannot change under the hooks. Not
-- granted: _rotate and rotation_blockers call it.
create or replace function pgque._rotate_hold(i_queue_id integer, i_table integer)
returns text language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn  regprocedure;
    v_why text;
begin
    for v_fn in select hook_fn from pgque.layer_hook where hook_kind = 'rotate' order by hook_name loop
        execute format('select %s($1, $2)', v_fn::regproc) into v_why using i_queue_id, i_table;
        if v_why is not null then
            return v_why;
        end if;
    end loop;
    return null;
end;
$$;
