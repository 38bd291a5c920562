-- Upgrade helpers for the structure files.
--
-- Re-applying the install upgrades in place while workers run, so a
-- structure statement must not lock a table that is already as it should
-- be. ALTER TABLE ... ADD COLUMN IF NOT EXISTS takes an ACCESS EXCLUSIVE
-- lock and CREATE INDEX IF NOT EXISTS a SHARE lock before they look for
-- the column or index: held to the end of the install transaction, the
-- first blocks every consumer and the second every producer, and either
-- can deadlock with a worker's transaction that already holds a lock on
-- another pgque table. These helpers look in the catalog first and run the
-- statement only when there is something to create. The statements are
-- constants of the install script, never caller input. Not granted.

-- _add_column(table, column, ddl): runs ddl (an ALTER TABLE ... ADD
-- COLUMN) unless table already has column.
create or replace function pgque._add_column(i_table regclass, i_column text, i_ddl text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pg_catalog.pg_attribute
                    where attrelid = i_table and attname = i_column and not attisdropped) then
        execute i_ddl;
    end if;
end;
$$;

-- _create_index(index, ddl): runs ddl (a CREATE INDEX) unless schema pgque
-- already has a relation named index.
create or replace function pgque._create_index(i_index text, i_ddl text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                    where n.nspname = 'pgque' and c.relname = i_index) then
        execute i_ddl;
    end if;
end;
$$;

revoke all on function pgque._add_column(regclass, text, text), pgque._create_index(text, text) from public;

-- Views are replaced by the install (create or replace view takes an
-- ACCESS EXCLUSIVE lock on each). A reader of a view that reads another
-- view through it locks the outer one first and then the inner one, in
-- an order the install cannot know, so the install takes every view's lock
-- here, before any other lock of its own, and never waits while holding
-- one: each attempt waits at most 100 ms per view, and a failed attempt
-- gives back the locks it took (the exception block is a subtransaction)
-- and tries again a little later.
do $views$
declare
    v_views regclass[];
    v       regclass;
    v_lt    text := pg_catalog.current_setting('lock_timeout');
begin
    v_views := array(select c.oid::regclass from pg_catalog.pg_class c
                       join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                      where n.nspname = 'pgque' and c.relkind = 'v' order by c.relname desc);
    for i in 1 .. 50 loop
        begin
            perform pg_catalog.set_config('lock_timeout', '100ms', true);
            foreach v in array v_views loop
                execute format('lock table %s in access exclusive mode', v);
            end loop;
            exit;
        exception when lock_not_available then
            if i = 50 then
                raise exception using errcode = '55P03',
                    message = 'pgque''s views stayed busy: could not lock them for the upgrade; try again';
            end if;
            perform pg_catalog.pg_sleep(0.01 * i);
        end;
    end loop;
    perform pg_catalog.set_config('lock_timeout', v_lt, true);
end
$views$;
