-- What the calling role has that the owner of schema pgque lacks, among
-- the rights that code running as the caller could turn against the
-- cluster: NULL when nothing, when the schema is the caller's own or a
-- superuser's, or when the caller may not use it (nothing there can be
-- called); no row when there is no schema pgque. The clients ask it
-- before their first call into the schema (Go install.TrustSchema,
-- TypeScript trustSchema): every function there is the owner's code, run
-- with the caller's rights or, SECURITY DEFINER, able to change the
-- caller's session. Only catalogs are read, every operator pg_catalog's.
select o.rolname as owner, r.rolname as caller,
       case
           when not pg_catalog.has_schema_privilege(n.oid, 'USAGE') or n.nspowner operator(pg_catalog.=) r.oid
                or o.rolsuper then null
           when r.rolsuper then 'SUPERUSER'
           when r.rolcreaterole and not o.rolcreaterole then 'CREATEROLE'
           when r.rolbypassrls and not o.rolbypassrls then 'BYPASSRLS'
           when r.rolreplication and not o.rolreplication then 'REPLICATION'
           else (select 'membership in ' operator(pg_catalog.||) pg_catalog.min(p.rolname::pg_catalog.text)
                   from pg_catalog.pg_roles p
                  where p.rolname operator(pg_catalog.=) any ('{pg_execute_server_program,pg_read_server_files,pg_write_server_files,pg_read_all_data,pg_write_all_data,pg_signal_backend}'::pg_catalog.name[])
                    and pg_catalog.pg_has_role(r.oid, p.oid, 'MEMBER') and not pg_catalog.pg_has_role(o.oid, p.oid, 'MEMBER'))
       end as lacks
  from pg_catalog.pg_namespace n, pg_catalog.pg_roles r, pg_catalog.pg_roles o
 where n.nspname operator(pg_catalog.=) 'pgque' and r.rolname operator(pg_catalog.=) current_user
   and o.oid operator(pg_catalog.=) n.nspowner
