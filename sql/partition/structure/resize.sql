-- Online resize of a slot group (see functions/pgque.resize_slots.sql).
--
-- A resize is recorded on the slot group's row, which changes once per
-- phase (start, cutover), never per batch: sg_resize_to is the target N
-- while a resize is in progress (NULL otherwise), sg_seal_tick the tick at
-- which the old slots' subscriptions were sealed, sg_resize_started and
-- sg_resized_at when the last resize began and completed, sg_past_nslots
-- every N the group had before (a process started later with one of them
-- follows the current N instead of failing).
select pgque._add_column('pgque.slot_group', 'sg_resize_to', $ddl$alter table pgque.slot_group add column sg_resize_to integer$ddl$);
select pgque._add_column('pgque.slot_group', 'sg_seal_tick', $ddl$alter table pgque.slot_group add column sg_seal_tick bigint$ddl$);
select pgque._add_column('pgque.slot_group', 'sg_resize_started', $ddl$alter table pgque.slot_group add column sg_resize_started timestamptz$ddl$);
select pgque._add_column('pgque.slot_group', 'sg_resized_at', $ddl$alter table pgque.slot_group add column sg_resized_at timestamptz$ddl$);
select pgque._add_column('pgque.slot_group', 'sg_past_nslots', $ddl$alter table pgque.slot_group add column sg_past_nslots integer[] not null default '{}'$ddl$);

do $$
begin
    if not exists (select 1 from pg_catalog.pg_constraint
                    where conrelid = 'pgque.slot_group'::regclass and conname = 'slot_group_sg_resize_to_check') then
        alter table pgque.slot_group add constraint slot_group_sg_resize_to_check
            check (sg_resize_to is null or sg_resize_to between 1 and 1024);
    end if;
end;
$$;
