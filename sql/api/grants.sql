-- API privileges.
revoke all on all functions in schema pgque from public;
select pgque._revoke_public_relations();

grant execute on function
    pgque.send(text, jsonb),
    pgque.send(text, text, jsonb),
    pgque.send(text, text, jsonb, text, text),
    pgque.send(text, text, text, text, text),
    pgque.send_batch(text, text, jsonb[], text[], text[]),
    pgque.send_batch(text, text, text[], text[], text[]),
    pgque.send_batch(text, text[], jsonb[], text[], text[]),
    pgque.send_batch(text, text[], text[], text[], text[])
    to pgque_writer, pgque_admin;

grant execute on function
    pgque.subscribe(text, text),
    pgque.unsubscribe(text, text),
    pgque.rewind_new_subscription(text, text),
    pgque.receive(text, text, integer),
    pgque.receive_raw(text, text, integer, bigint),
    pgque.ack(bigint),
    pgque.nack(bigint, bigint, interval, text),
    pgque.complete_in_tx(text, text, bigint, bigint)
    to pgque_reader, pgque_admin;

-- Table attachment: attach_table/detach_table run as their caller (who
-- needs the TRIGGER privilege on the table); the helpers they call are
-- granted with them, and the two trigger functions too, since creating a
-- trigger needs EXECUTE on its function (firing it does not: the table's
-- writers need no grant).
grant execute on function
    pgque.attach_table(text, regclass, text, text[], text[], text[], text, boolean),
    pgque.detach_table(text, regclass),
    pgque.attached_tables(),
    pgque._table_source_record(text, regclass, text, text[], text[], text[], text, boolean),
    pgque._table_source_hook(integer, regclass, text[], text, text[], text[], text, boolean),
    pgque._table_source_unhook(integer, regclass),
    pgque._table_source_trigger_name(text),
    pgque._table_source_forget(text, regclass),
    pgque._table_source_capture(),
    pgque._table_source_emit()
    to pgque_admin;

grant execute on function pgque.events_before_subscription(text, text) to pgque_reader, pgque_writer, pgque_admin;

select pgque._grant_select(array['pgque.dedup_state', 'pgque.table_source']::regclass[],
    array['pgque_admin']::regrole[]);
