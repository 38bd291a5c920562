-- Engine privileges. Nothing is executable by PUBLIC; the layers above
-- re-run the blanket revoke for their own functions.
revoke all on all functions in schema pgque from public;
select pgque._revoke_public_relations();
revoke all on procedure pgque.run_ticker(integer, text) from public;

grant execute on function
    pgque.insert_event(text, text, text),
    pgque.insert_event(text, text, text, text, text, text, text)
    to pgque_writer, pgque_admin;

-- The engine's consuming calls act on any subscription with no further
-- check: they are for pgque_admin (and PgQ-style tools run by it). Readers
-- consume through the layers above, which add their own checks.
grant execute on function
    pgque.register_consumer(text, text),
    pgque.unregister_consumer(text, text),
    pgque.next_batch(text, text),
    pgque.get_batch_events(bigint),
    pgque.finish_batch(bigint),
    pgque.event_retry(bigint, bigint, integer),
    pgque.event_defer(bigint, bigint, text),
    pgque.event_undefer(text, text, text)
    to pgque_admin;

-- The slot views (partition layer) call _may_read with the caller's
-- rights to leave out the queues the caller may not read.
grant execute on function pgque._may_read(integer) to pgque_reader, pgque_writer, pgque_admin;

grant execute on function
    pgque.version(),
    pgque.get_queue_info(text),
    pgque.get_consumer_info(text, text)
    to pgque_reader, pgque_writer, pgque_admin;

-- get_batch_cursor pastes extra_where into SQL: owner and admin only.
grant execute on function
    pgque.create_queue(text),
    pgque.drop_queue(text),
    pgque.drop_queue(text, boolean),
    pgque.ticker(),
    pgque.ticker(text),
    pgque.force_next_tick(text),
    pgque.ticker_lead(text, interval),
    pgque.ticker_resign(text),
    pgque.get_batch_cursor(bigint, text, integer, text),
    pgque.maint_retry_events(),
    pgque.maint(),
    pgque.set_queue_config(text, text, text),
    pgque.start(),
    pgque.stop(),
    pgque.grant_queue(text, text, text),
    pgque.revoke_queue(text, text, text),
    pgque.unconfine_queue(text, text),
    pgque.rotation_blockers()
    to pgque_admin;

grant execute on procedure pgque.run_ticker(integer, text) to pgque_admin;
-- run_ticker runs as its caller, so the caller needs its helpers.
grant execute on function
    pgque._run_ticker_end(integer),
    pgque._maint_after_hooks(),
    pgque._run_ticker_round(text, timestamptz, timestamptz, timestamptz),
    pgque._run_ticker_round(text, timestamptz, timestamptz, timestamptz, timestamptz)
    to pgque_admin;

-- The admin reads the engine's tables (not a queue's own event tables).
select pgque._grant_select(array['pgque.dead_letter', 'pgque.deferred', 'pgque.event', 'pgque.layer_hook',
        'pgque.queue', 'pgque.queue_grant', 'pgque.retry_queue', 'pgque.rotation',
        'pgque.sub_state', 'pgque.sub_state_0', 'pgque.sub_state_1', 'pgque.subscription',
        'pgque.tick', 'pgque.tick_0', 'pgque.tick_1', 'pgque.ticker_lease', 'pgque.version']::regclass[],
    array['pgque_admin']::regrole[]);
