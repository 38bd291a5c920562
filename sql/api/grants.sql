-- API privileges.
revoke all on all functions in schema pgque from public;
revoke all on all tables in schema pgque from public;

grant execute on function
    pgque.send(text, jsonb),
    pgque.send(text, text, jsonb),
    pgque.send(text, text, jsonb, text),
    pgque.send_batch(text, text, jsonb[], text[])
    to pgque_writer, pgque_admin;

grant execute on function
    pgque.subscribe(text, text),
    pgque.unsubscribe(text, text),
    pgque.receive(text, text, integer),
    pgque.ack(bigint),
    pgque.nack(bigint, bigint, interval, text)
    to pgque_reader, pgque_admin;
