-- The install script runs with a pinned search_path: column defaults,
-- CHECK constraints and views bind their functions and operators when they
-- are created, so a role whose search_path puts public before pg_catalog
-- would otherwise bind them to whatever an attacker planted in public
-- (public.now(), public.=(text,text), ...), to run later as the owner.
select pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Roles.
--
-- pgque_reader consumes, pgque_writer produces, pgque_admin does both plus
-- DDL and maintenance. Roles are cluster-wide: they are created here only
-- when missing, which needs CREATEROLE. An owner without CREATEROLE can
-- install once a DBA has created the three roles (NOLOGIN is enough).
do $roles$
declare
    r text;
begin
    foreach r in array array['pgque_reader', 'pgque_writer', 'pgque_admin'] loop
        if not exists (select 1 from pg_catalog.pg_roles where rolname = r) then
            begin
                execute pg_catalog.format('create role %I nologin', r);
            exception when insufficient_privilege then
                raise exception using
                    errcode = '42501',
                    message = pg_catalog.format('role %s does not exist and the installing role may not create it', r),
                    hint = 'create the roles pgque_reader, pgque_writer and pgque_admin first (CREATE ROLE ... NOLOGIN), or install as a role with CREATEROLE';
            when unique_violation or duplicate_object then
                -- The installer of another database of the cluster created
                -- it meanwhile (the install lock is per database): it exists.
                null;
            end;
        end if;
    end loop;
end
$roles$;

create schema if not exists pgque;
revoke all on schema pgque from public;
grant usage on schema pgque to pgque_reader, pgque_writer, pgque_admin;

-- _role_admins(): the roles other than the calling one and superusers that
-- hold ADMIN OPTION on a pgque role, as 'role on pgque_role', sorted: each
-- may grant that role to any role, itself included. On PostgreSQL 16 and
-- later a CREATEROLE role holds it on every role it created, so one that
-- created pgque's roles before the first install keeps that power; the
-- install cannot tell it from a DBA or from the owner of pgque in another
-- database, so the installers report it instead of refusing (Go:
-- install.Result.RoleAdmins, `pgque install`'s warning; TypeScript:
-- migrate()'s roleAdmins). Reads the catalog only. Not granted: the
-- installing owner calls it.
create or replace function pgque._role_admins()
returns text[] language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select coalesce(array_agg(a order by a), '{}') from (
        select distinct format('%s on %s', m.member::regrole, m.roleid::regrole) as a
          from pg_auth_members m join pg_roles r on r.oid = m.member
         where m.roleid = any (array(select oid from pg_roles
                                      where rolname = any ('{pgque_reader,pgque_writer,pgque_admin}')))
           and m.admin_option and not r.rolsuper and r.rolname <> current_user) s
$$;
