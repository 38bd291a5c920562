-- Worker presence: which worker processes of a partitioned consumer are
-- alive, which slots they work, and whether they want more ("hungry").
--
-- Pools used to tell each other this by NOTIFY alone, but any role of the
-- cluster may LISTEN (reading queue names and worker ids) and NOTIFY
-- (forging hungry workers, so real pools give slots up). Presence is
-- therefore kept here, written and read only through announce_worker;
-- NOTIFY on the presence channel is a wake-up hint whose payload nobody
-- trusts. Rows are soft state, pruned by announce_worker.
create table if not exists pgque.worker_presence (
    wp_queue    integer not null references pgque.queue (queue_id) on delete cascade,
    wp_consumer text not null,
    wp_worker   text not null,
    wp_hungry   boolean not null,
    wp_slots    integer[] not null,
    wp_seen     timestamptz not null,
    primary key (wp_queue, wp_consumer, wp_worker)
) with (fillfactor = 50);
