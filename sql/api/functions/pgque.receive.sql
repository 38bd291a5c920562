-- Consuming with a plain subscription: receive, ack, nack. Slot
-- subscriptions ("c#k/N") are refused here with PQ033: they must go through
-- the partition layer, which enforces the lease.

-- _refuse_slot(subscription): raises PQ033 for a slot subscription.
create or replace function pgque._refuse_slot(i_sub_name text)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if strpos(i_sub_name, '#') > 0 then
        raise exception using errcode = 'PQ033',
            message = format('%L is a slot subscription; use receive_partitioned, ack_partitioned and nack_partitioned', i_sub_name);
    end if;
end;
$$;

-- receive(queue, consumer, max): the next chunk of at most max events of
-- the consumer's open batch, in ev_id order, payloads as jsonb. The same
-- chunk comes back until it is acked. A consumer that is behind takes
-- several ticks per batch (about max events' worth, see _open_batch).
-- receive_raw is the same without the jsonb parse.
create or replace function pgque.receive(i_queue text, i_consumer text, i_max integer default 100)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._not_null('consumer name', i_consumer);
    perform pgque._refuse_slot(i_consumer);
    return query select * from unnest(pgque._as_messages(i_queue, i_consumer, i_max, null, null, i_max));
end;
$$;

-- receive_raw(queue, consumer, max, ack_batch): receive with the payload
-- as stored (text; send stores JSON, so it is JSON text) and an optional
-- acknowledgement first: when ack_batch is given, the chunk last received
-- from that batch is acknowledged (as ack would) and the next chunk is
-- returned, in one call and one transaction. ack_batch must be the
-- consumer's open batch (PQ020 otherwise, and nothing is acknowledged).
-- Defined in api/functions/pgque.deliver_raw.gen.sql, with _deliver_raw's
-- body: receive_raw(i_queue, i_consumer, i_max default 100, i_ack_batch
-- default null), SECURITY DEFINER, the access checks first (consume on the
-- queue; no slot subscription), then _deliver_raw(queue, consumer, max,
-- no slot, span max, ack_batch) run in place.

-- ack(batch_id): acknowledges the chunk the last receive returned. Returns
-- 1 when the batch is finished, 0 when more of it remains to be received.
create or replace function pgque.ack(i_batch_id bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize_batch(i_batch_id, 'consume'); -- access check
    -- The subscription's name only; _ack checks the batch under the lock.
    perform pgque._refuse_slot(s.sub_name) from pgque.subscription s
     where s.sub_id = pgque._batch_sub(i_batch_id);
    return pgque._ack(i_batch_id);
end;
$$;

-- nack(batch_id, msg_id, retry_after, reason): redeliver one received event
-- to this consumer only after retry_after, or dead-letter it once it has
-- been retried max_retries times (the reason is kept with it). Returns 1
-- when retried, 0 when dead-lettered. The chunk must still be acked.
-- PQ038 when the event was completed in a transaction (complete_in_tx).
create or replace function pgque.nack(i_batch_id bigint, i_msg_id bigint, i_retry_after interval,
                                      i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize_batch(i_batch_id, 'consume'); -- access check
    perform pgque._refuse_slot((pgque._batch(i_batch_id)).sub_name);
    perform pgque._refuse_done(pgque._batch_sub(i_batch_id), i_msg_id);
    return pgque._event_retry(i_batch_id, i_msg_id, i_retry_after, i_reason);
end;
$$;
