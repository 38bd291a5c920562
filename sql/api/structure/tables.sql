-- API tables.
--
-- sub_progress records how far the open batch of a subscription has been
-- handed out and acknowledged, so a batch can be delivered in chunks across
-- transactions with no session state (works through transaction poolers).
-- One row per subscription, updated in place (fillfactor 50, HOT).
create table if not exists pgque.sub_progress (
    sub_id        integer primary key references pgque.subscription (sub_id) on delete cascade,
    batch_id      bigint not null,
    acked_to      bigint,            -- last ev_id acknowledged, NULL: none yet
    delivered_to  bigint,            -- last ev_id handed out by the last receive
    delivered_all boolean not null default false  -- the last receive reached the batch's end
) with (fillfactor = 50);

-- pgque.message: one delivered event, as receive returns it.
do $message$
begin
    if not exists (select 1 from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid = t.typnamespace
                    where n.nspname = 'pgque' and t.typname = 'message') then
        create type pgque.message as (
            msg_id        bigint,
            batch_id      bigint,
            type          text,
            payload       jsonb,
            retry_count   integer,
            created_at    timestamptz,
            partition_key text,
            extra2        text,
            extra3        text,
            extra4        text
        );
    end if;
end
$message$;
