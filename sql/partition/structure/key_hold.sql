-- Key holds (lanes): key_block gains the state "inflight" and the epoch of
-- the worker that took the hold.
--
-- A slot worked by key lanes acknowledges its chunk while a slow key is
-- still running: that key is held on the server, the way pause holds a
-- blocked key. State "inflight": the worker of epoch kb_epoch runs the key's
-- events from kb_head on; copies of them, and every later event of the key,
-- are deferred under the key's group until the worker settles the hold (or
-- a new owner of the slot releases it after a crash). kb_wait is -1: no
-- event is awaited through the log while a key is inflight.
select pgque._add_column('pgque.key_block', 'kb_epoch', $ddl$alter table pgque.key_block add column kb_epoch bigint$ddl$);

do $$
begin
    if not exists (select 1 from pg_catalog.pg_constraint
                    where conrelid = 'pgque.key_block'::regclass
                      and conname = 'key_block_kb_state_check'
                      and pg_catalog.pg_get_constraintdef(oid) like '%inflight%') then
        alter table pgque.key_block drop constraint if exists key_block_kb_state_check;
        alter table pgque.key_block add constraint key_block_kb_state_check
            check (kb_state in ('blocked', 'releasing', 'inflight'));
    end if;
end;
$$;
