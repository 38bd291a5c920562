-- version(): the installed pgque version, for every pgque role (the
-- pgque.version table itself is readable by pgque_admin only). Clients and
-- the CLI call it to check that pgque is installed before anything else.
-- Returns NULL when the version row is missing. Tables: version.
create or replace function pgque.version()
returns text language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$ select v.version from pgque.version v $$;
