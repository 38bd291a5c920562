-- Ticking from inside the database with pg_cron.
--
-- The Go ticker daemon (`pgque ticker`, or pgque.Ticker in a Go process) is
-- the usual way to tick. Where running a daemon is not an option, start()
-- schedules the same work with pg_cron: a job every minute calls the
-- run_ticker procedure, which ticks every 10 ms, moves due retries every
-- second and runs maint() every 30 seconds, and the layers' 'maint_after'
-- hooks in the round after it, for 55 seconds, committing after every
-- round so ticks become visible at once. pg_cron's finest schedule is
-- one minute, hence the loop. run_ticker takes the ticker lease like any
-- ticker daemon, so it never ticks alongside a live daemon.

-- _run_ticker_round(worker, end, next retry, next maint, next indexes):
-- one round of run_ticker: ticks when worker holds the ticker lease, moves
-- due retries and runs maint() when their time came, and the 'maint_after'
-- hooks (_maint_after_hooks) when theirs came, which is the round after
-- maint(): a transaction of their own, as the ticker daemons give the same
-- calls, since what they lock stays locked until the round commits.
-- Returns whether the loop goes on (end not reached) and the next times.
-- The round's transaction commits without waiting for its WAL flush, as
-- the ticker daemons' ticker() calls do (docs/design.md, "Ticks commit
-- without a flush"): run_ticker commits after each round, so the setting
-- (local to the transaction) covers the round alone. What else a round
-- may do loses nothing either when a crash drops it: a lease renewal, a
-- retry moved back (it is still in retry_queue), maint()'s work (done
-- again; a commit that drops relations is flushed by PostgreSQL anyway).
-- Tables: through ticker_lead, ticker, maint_retry_events, maint and the
-- hooks.
create or replace function pgque._run_ticker_round(i_worker text, i_end timestamptz,
                                                   i_next_retry timestamptz, i_next_maint timestamptz,
                                                   i_next_indexes timestamptz,
                                                   out more boolean, out next_retry timestamptz,
                                                   out next_maint timestamptz, out next_indexes timestamptz)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform set_config('synchronous_commit', 'off', true);
    next_retry := i_next_retry;
    next_maint := i_next_maint;
    next_indexes := i_next_indexes;
    if pgque.ticker_lead(i_worker, interval '5 seconds') then
        perform pgque.ticker();
        if clock_timestamp() >= next_retry then
            perform pgque.maint_retry_events();
            next_retry := clock_timestamp() + interval '1 second';
        end if;
        if clock_timestamp() >= next_maint then
            perform pgque.maint();
            next_maint := clock_timestamp() + interval '30 seconds';
            next_indexes := clock_timestamp();
        elsif clock_timestamp() >= next_indexes then
            perform pgque._maint_after_hooks();
            next_indexes := 'infinity';
        end if;
    end if;
    more := clock_timestamp() < i_end;
end;
$$;

-- _run_ticker_round(worker, end, next retry, next maint): the round of the
-- run_ticker of an earlier version, which may still be looping while this
-- one is installed; it runs no 'maint_after' hook, which its next minute's
-- run does.
create or replace function pgque._run_ticker_round(i_worker text, i_end timestamptz,
                                                   i_next_retry timestamptz, i_next_maint timestamptz,
                                                   out more boolean, out next_retry timestamptz, out next_maint timestamptz)
language sql
set search_path = pg_catalog, pg_temp
as $$
    select r.more, r.next_retry, r.next_maint
      from pgque._run_ticker_round(i_worker, i_end, i_next_retry, i_next_maint, 'infinity') r
$$;

-- _run_ticker_end(seconds): validates run_ticker's seconds (1..3600) and
-- returns when the loop ends.
create or replace function pgque._run_ticker_end(i_seconds integer)
returns timestamptz language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_seconds is null or i_seconds < 1 or i_seconds > 3600 then
        raise exception using errcode = 'PQ011', message = format('seconds must be between 1 and 3600, not %s', i_seconds);
    end if;
    return clock_timestamp() + make_interval(secs => i_seconds);
end;
$$;

-- run_ticker(seconds, worker): the ticker loop, for pg_cron or by hand.
-- Returns when seconds have passed. Must be CALLed outside a transaction
-- block (it commits), which rules out SECURITY DEFINER and a pinned
-- search_path for a procedure: it runs as its caller (pgque_admin or the
-- owner) under the caller's search_path. So its body holds no operator
-- and no unqualified type or function at all (an attacker's public.<
-- or public.timestamptz would run as the caller); the work and every
-- comparison happen in _run_ticker_round, which pins its search_path.
create or replace procedure pgque.run_ticker(i_seconds integer default 55, i_worker text default 'pg_cron')
language plpgsql
as $$
declare
    v_end   pg_catalog.timestamptz := pgque._run_ticker_end(i_seconds);
    v_retry pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_maint pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_indexes pg_catalog.timestamptz := 'infinity';
    v_more  pg_catalog.bool := true;
begin
    while v_more loop
        select r.more, r.next_retry, r.next_maint, r.next_indexes into v_more, v_retry, v_maint, v_indexes
          from pgque._run_ticker_round(i_worker, v_end, v_retry, v_maint, v_indexes) r;
        commit;
        perform pg_catalog.pg_sleep(0.01);
    end loop;
    perform pgque.ticker_resign(i_worker);
    commit;
end;
$$;

-- start(): schedules run_ticker every minute with pg_cron (the extension
-- must be installed in this database). Returns the job id. Idempotent.
create or replace function pgque.start()
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_job bigint;
begin
    if not exists (select 1 from pg_extension where extname = 'pg_cron') then
        raise exception using errcode = 'PQ011',
            message = 'pg_cron is not installed in this database',
            hint = 'add pg_cron to shared_preload_libraries, set cron.database_name to this database, CREATE EXTENSION pg_cron; or run the ticker daemon (pgque ticker)';
    end if;
    execute 'select cron.schedule($1, $2, $3)' into v_job
      using 'pgque_ticker', '* * * * *', 'call pgque.run_ticker(55)';
    return v_job;
end;
$$;

-- stop(): removes the pg_cron job that start() created. Returns true when
-- there was one.
create or replace function pgque.stop()
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_done boolean := false;
begin
    if exists (select 1 from pg_extension where extname = 'pg_cron') then
        execute 'select exists (select 1 from cron.job where jobname = $1)' into v_done using 'pgque_ticker';
        if v_done then
            execute 'select cron.unschedule($1)' using 'pgque_ticker';
        end if;
    end if;
    return v_done;
end;
$$;
