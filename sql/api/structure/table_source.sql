-- Tables attached to queues (attach_table): every INSERT/UPDATE/DELETE on
-- the table emits an event from a trigger whose function is generated at
-- attach time with static SQL (pgque._src_<queue_id>_<table oid>). One row
-- per (queue, table); written only by attach_table and detach_table.
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
    ts_function       regprocedure not null,
    ts_attached       timestamptz not null default now(),
    primary key (ts_queue, ts_table)
);
