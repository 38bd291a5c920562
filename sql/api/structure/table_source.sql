-- Tables attached to queues (attach_table): every INSERT/UPDATE/DELETE on
-- the table emits an event from triggers that call pgque's two generic
-- trigger functions with the attachment in their arguments
-- (pgque.table_source.sql). One row per (queue, table); written only by
-- attach_table and detach_table.
create table if not exists pgque.table_source (
    ts_queue          integer not null references pgque.queue (queue_id) on delete cascade,
    ts_table          oid not null,
    ts_table_name     text not null,      -- schema.table, quoted, as stored in ev_extra2
    ts_key_column     name not null,
    ts_operations     text[] not null,
    ts_columns        text[],             -- keep only these (NULL: all)
    ts_exclude        text[],             -- leave these out (NULL: none)
    ts_skip_unchanged boolean not null,
    ts_when           text,
    ts_attached       timestamptz not null default now(),
    primary key (ts_queue, ts_table)
);

-- Earlier versions generated one trigger function per attachment and
-- recorded it in ts_function; the attachments no longer have functions of
-- their own (pgque.table_source.sql replaces the old triggers). Looked up
-- first so that a re-install of this version locks nothing.
do $ts_function$
begin
    if exists (select 1 from pg_catalog.pg_attribute
                where attrelid = 'pgque.table_source'::regclass and attname = 'ts_function' and not attisdropped) then
        alter table pgque.table_source drop column ts_function;
    end if;
end
$ts_function$;
