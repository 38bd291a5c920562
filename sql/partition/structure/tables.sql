-- Partition layer tables.
--
-- slot_group persists N (and the failure policy) per (queue, consumer):
-- subscribing with another N is refused. slot_lease has one row per slot:
-- the slot's subscription, the lease (owner, until, ttl) and its epoch,
-- which grows on every change of owner and fences zombies. Lease renewals
-- are in-place HOT updates (fillfactor 50), at most one per half TTL.
create table if not exists pgque.slot_group (
    sg_queue    integer not null references pgque.queue (queue_id) on delete cascade,
    sg_consumer text not null,
    sg_nslots   integer not null check (sg_nslots between 1 and 1024),
    sg_policy   text not null default 'skip' check (sg_policy in ('skip', 'pause')),
    sg_created  timestamptz not null default now(),
    primary key (sg_queue, sg_consumer)
);

create table if not exists pgque.slot_lease (
    sl_queue    integer not null,
    sl_consumer text not null,
    sl_slot     integer not null,
    sl_sub      integer not null references pgque.subscription (sub_id) on delete cascade,
    sl_owner    text,
    sl_until    timestamptz,
    sl_ttl      interval,
    sl_epoch    bigint not null default 0,
    primary key (sl_queue, sl_consumer, sl_slot),
    foreign key (sl_queue, sl_consumer) references pgque.slot_group (sg_queue, sg_consumer) on delete cascade
) with (fillfactor = 50);
