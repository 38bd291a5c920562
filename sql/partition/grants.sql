-- Partition layer privileges. Readers reach get_batch_cursor only through
-- these SECURITY DEFINER functions, which own it together with the engine.
revoke all on all functions in schema pgque from public;
select pgque._revoke_public_relations();

grant execute on function
    pgque.subscribe_slot(text, text, integer, integer),
    pgque.subscribe_slot(text, text, integer, integer, text),
    pgque.blocked_keys(text, text),
    pgque.unsubscribe_slot(text, text, integer, integer),
    pgque.claim_slot(text, text, integer, text, interval, uuid, integer),
    pgque.release_slot(text, text, integer, text, uuid),
    pgque.receive_partitioned(text, text, integer, integer, text, uuid, integer),
    pgque.receive_partitioned_raw(text, text, integer, integer, text, uuid, integer, bigint, bigint, bigint),
    pgque.receive_partitioned_raw_slots(text, text, text, integer, integer[], integer[], uuid[], bigint[], bigint[], bigint[]),
    pgque.ack_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, bigint),
    pgque.nack_partitioned(text, text, integer, integer, text, uuid, bigint, interval, text),
    pgque.nack_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, bigint, interval, text),
    pgque.complete_partitioned_in_tx(text, text, integer, integer, text, uuid, bigint, bigint, bigint),
    pgque.slot_of(text, integer),
    pgque.announce_worker(text, text, text, boolean, integer[], interval),
    pgque.hold_key_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, text, bigint),
    pgque.hold_keys_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, text[], bigint[]),
    pgque.settle_held_partitioned(text, text, integer, integer, text, uuid, bigint, text, bigint, bigint[], bigint[], interval[], text[]),
    pgque.release_stale_holds_partitioned(text, text, integer, integer, text, uuid),
    pgque.slot_group_info(text, text)
    to pgque_reader, pgque_admin;

-- Online resize (pgque.resize_slots.sql): starting one is an admin's act;
-- its progress is readable by every pgque role.
grant execute on function pgque.resize_slots(text, text, integer) to pgque_admin;
grant execute on function pgque.resize_status(text) to pgque_reader, pgque_writer, pgque_admin;

grant execute on function
    pgque.set_failure_policy(text, text, text),
    pgque.unblock_key(text, text, text),
    pgque.retry_key_now(text, text, text),
    pgque.maint_route_indexes()
    to pgque_admin;

grant execute on function pgque._slot_pending(integer, integer, integer) to pgque_reader, pgque_writer, pgque_admin;
grant execute on function pgque._slot_held(integer) to pgque_reader, pgque_writer, pgque_admin;
-- partition_slot_leases calls it with the caller's rights; it tells only
-- whether a pid is a backend, which pg_stat_activity tells every role.
grant execute on function pgque._session_gone(integer) to pgque_reader, pgque_writer, pgque_admin;
select pgque._grant_select(array['pgque.partition_slot_status', 'pgque.partition_slot_leases', 'pgque.partition_slot_stalls']::regclass[],
    array['pgque_reader', 'pgque_writer', 'pgque_admin']::regrole[]);

-- Per-key visibility (pgque.key_status.sql): read-only, for every pgque role.
grant execute on function
    pgque.key_heads(text, text, integer, integer, integer),
    pgque.key_shares(text, text, integer),
    pgque.hot_keys(text, interval, integer, integer),
    pgque.slot_heads(text, text)
    to pgque_reader, pgque_writer, pgque_admin;

-- Readers (api/functions/pgque.deliver_raw.sql) for the slot counts in
-- use: the api layer remade those that exist; an install that had none
-- gets them here.
select pgque._make_reader(x.queue_id, x.nslots, false)
  from (select sg_queue as queue_id, sg_nslots as nslots from pgque.slot_group
        union
        select sg_queue, sg_resize_to from pgque.slot_group where sg_resize_to is not null) x;

-- Dead letters: listed by consumer name (a slot consumer's covers its
-- slots), replayed with a report of the later events of the key.
grant execute on function
    pgque.dlq_list(text, text, integer)
    to pgque_reader, pgque_admin;
grant execute on function
    pgque.dlq_replay(text, bigint),
    pgque.dlq_replay_report(text, bigint),
    pgque.dlq_purge(text, text, interval)
    to pgque_admin;
