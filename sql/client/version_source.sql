-- Where the installed version may be read without running another role's
-- code as the caller (Go install.InstalledVersion, TypeScript
-- installedVersion): has_table, a pgque.version table the caller may
-- use that is its own, or a plain text-typed table without row security
-- owned by the schema's owner; has_fn, a pgque.version() that is the
-- caller's own, or SECURITY DEFINER with a pinned search_path and owned by
-- the schema's owner, as pgque's is. The function is called when there
-- is one, else the table is read (installs older than the function).
select exists (select 1 from pg_catalog.pg_class c
                join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) c.relnamespace
               where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
                 and pg_catalog.has_schema_privilege(n.oid, 'USAGE')
                 and (c.relowner operator(pg_catalog.=) r.oid
                      or (c.relkind operator(pg_catalog.=) 'r' and not c.relrowsecurity
                          and c.relowner operator(pg_catalog.=) n.nspowner
                          and exists (select 1 from pg_catalog.pg_attribute a
                                       where a.attrelid operator(pg_catalog.=) c.oid
                                         and a.attname operator(pg_catalog.=) 'version'
                                         and a.atttypid operator(pg_catalog.=) 'pg_catalog.text'::pg_catalog.regtype)))) as has_table,
       exists (select 1 from pg_catalog.pg_proc p
                join pg_catalog.pg_namespace n on n.oid operator(pg_catalog.=) p.pronamespace
               where n.nspname operator(pg_catalog.=) 'pgque' and p.proname operator(pg_catalog.=) 'version'
                 and p.pronargs operator(pg_catalog.=) 0
                 and (p.proowner operator(pg_catalog.=) r.oid
                      or (p.prosecdef and p.proowner operator(pg_catalog.=) n.nspowner
                          and exists (select 1 from pg_catalog.unnest(p.proconfig) g
                                       where g operator(pg_catalog.~~) 'search\_path=%')))) as has_fn
  from pg_catalog.pg_roles r
 where r.rolname operator(pg_catalog.=) current_user
