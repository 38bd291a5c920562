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

-- _create_view(view, ddl): runs ddl (a CREATE OR REPLACE VIEW of
-- pgque.view) unless the view was last made by this very ddl. CREATE OR
-- REPLACE VIEW takes an ACCESS EXCLUSIVE lock on the view even when nothing
-- changes: it waits for every reader of the view (a status poll that is
-- itself waiting behind maint's TRUNCATE of an event table is enough for a
-- deadlock) and stops every reader that comes after it. The md5 of the ddl
-- is kept as the view's comment, which only its owner can set.
create or replace function pgque._create_view(i_view text, i_ddl text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_mark text := 'pgque view, ddl md5 ' || md5(i_ddl);
    v_oid oid;
begin
    select c.oid into v_oid from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where n.nspname = 'pgque' and c.relname = i_view and c.relkind = 'v';
    if v_oid is not null and obj_description(v_oid, 'pg_class') is not distinct from v_mark then
        return;
    end if;
    execute i_ddl;
    execute format('comment on view pgque.%I is %L', i_view, v_mark);
end;
$$;

-- _revoke_public_relations(): "revoke all on all tables (and sequences) in
-- schema pgque from public", done only to the relations where PUBLIC holds
-- something. The blanket statement rewrites the pg_class row of every
-- table, event tables included, and keeps it locked to the end of the
-- install transaction; maint's TRUNCATE of an event table rewrites that row
-- too, so it waits for the install while holding an ACCESS EXCLUSIVE lock
-- on the table that readers queue behind: a deadlock as soon as the install
-- waits for one of those readers.
create or replace function pgque._revoke_public_relations()
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r record;
begin
    for r in
        select c.oid::regclass::text as rel, c.relkind
          from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
         where n.nspname = 'pgque' and c.relkind in ('r', 'p', 'v', 'm', 'f', 'S')
           and exists (select 1 from pg_catalog.aclexplode(c.relacl) a where a.grantee = 0)
    loop
        execute format('revoke all on %s %s from public',
                       case when r.relkind = 'S' then 'sequence' else 'table' end, r.rel);
    end loop;
end;
$$;

-- _grant_select(relations, roles): GRANT SELECT on each relation to each
-- role that does not hold it yet (see _revoke_public_relations for why).
create or replace function pgque._grant_select(i_rels regclass[], i_roles regrole[])
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_rel regclass;
    v_role regrole;
begin
    foreach v_rel in array i_rels loop
        foreach v_role in array i_roles loop
            if not exists (select 1 from pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                            where c.oid = v_rel and a.grantee = v_role and a.privilege_type = 'SELECT') then
                execute format('grant select on table %s to %s', v_rel, v_role);
            end if;
        end loop;
    end loop;
end;
$$;

revoke all on function pgque._add_column(regclass, text, text), pgque._create_index(text, text),
    pgque._create_view(text, text), pgque._revoke_public_relations(), pgque._grant_select(regclass[], regrole[]) from public;
