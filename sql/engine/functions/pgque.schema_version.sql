-- schema_version(): the pgque schema version installed in this database, as
-- recorded by the installer in pgque.version (NULL when no version row
-- exists). Clients compare it with the version they were built for before
-- they start. SECURITY DEFINER so every pgque role can call it without read
-- access to the version table.
--
-- Returns: text.
-- Tables: pgque.version (read).
create or replace function pgque.schema_version()
returns text language sql stable
security definer
set search_path = pg_catalog, pg_temp
as $$
    select v.version from pgque.version v where v.singleton;
$$;
