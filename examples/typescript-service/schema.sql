-- The service's own tables, applied at start by the database's owner after
-- pgque's migrate(); idempotent. files_app is the service's login.
create table if not exists requests (id text primary key, tenant text not null, event_ids bigint[] not null);
create table if not exists files (tenant text, path text, version int not null, primary key (tenant, path));
create table if not exists applied (seq bigserial primary key, tenant text not null, ev_id bigint not null, type text not null);
grant select, insert on requests, applied to files_app;
grant select, insert, update, delete on files to files_app;
grant usage on sequence applied_seq_seq to files_app;
