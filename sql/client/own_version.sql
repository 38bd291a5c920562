-- Whether schema pgque, its version table and its version function all
-- belong to the calling role (true when none exists): the installers
-- (Go ownVersion, TypeScript ownVersion) read the installed version before
-- the script's preflight only then, since calling a function or reading a
-- table (a view, a column type's output function) of a schema another
-- role prepared would run that role's code as the installer.
select coalesce(pg_catalog.bool_and(o.owner operator(pg_catalog.=) r.oid), true) as own
  from (select n.nspowner as owner from pg_catalog.pg_namespace n
         where n.nspname operator(pg_catalog.=) 'pgque'
        union all
        select c.relowner from pg_catalog.pg_class c
          join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
         where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
        union all
        select p.proowner from pg_catalog.pg_proc p
          join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace
         where n.nspname operator(pg_catalog.=) 'pgque' and p.proname operator(pg_catalog.=) 'version') o,
       pg_catalog.pg_roles r
 where r.rolname operator(pg_catalog.=) current_user
