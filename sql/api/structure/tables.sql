-- API tables.
--
-- Chunk progress (how far the open batch has been handed out and
-- acknowledged) is part of the engine's append-only state log,
-- pgque.sub_state. Installs before it kept one row per subscription in
-- pgque.sub_progress, updated in place: carry an open batch's progress
-- over and drop the table.
do $progress$
begin
    if to_regclass('pgque.sub_progress') is not null then
        insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                     st_acked_to, st_delivered_to, st_delivered_all)
        select s.sub_id, nextval('pgque.sub_state_seq'), s.sub_active, s.sub_last_tick, s.sub_next_tick,
               s.sub_batch, p.acked_to, p.delivered_to, p.delivered_all
          from pgque.sub_progress p
          join pgque.subscription s on s.sub_id = p.sub_id and s.sub_batch = p.batch_id
         where p.delivered_to is not null or p.acked_to is not null;
        drop table pgque.sub_progress;
    end if;
end
$progress$;

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
