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
