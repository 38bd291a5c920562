-- Partition layer tables.
--
-- slot_group persists N (and the failure policy) per (queue, consumer):
-- subscribing with another N is refused. slot_lease has one row per slot:
-- the slot's subscription, the lease (owner, until, ttl) and its epoch,
-- which grows on every change of owner and fences zombies. Renewals do not
-- update the row: they append to pgque.sub_state (see slot_lease.sql), so
-- the row changes only when its owner does.
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

-- sl_token: the SHA-256 of the lease token handed to the owner by the claim
-- that took the lease (NULL when nobody holds it). Only the hash is stored,
-- so nobody who can read this table or its views learns the credential;
-- it changes with the owner, in the same update, so it adds no row version.
-- Through _add_column (engine/structure/ddl.sql): a re-install must not
-- lock the lease table of running workers.
select pgque._add_column('pgque.slot_lease', 'sl_token',
    $ddl$alter table pgque.slot_lease add column sl_token bytea$ddl$);

-- sl_session: the backend pid of the holder's own LISTEN session, bound by
-- the holder's claim or renewal (NULL: not bound). A lease bound to a
-- session that is gone can be taken over before it expires (see "Dead
-- holders" in slot_lease.sql). Changed only with the owner or by a renewal
-- that binds another session: no row version on an ordinary renewal.
select pgque._add_column('pgque.slot_lease', 'sl_session',
    $ddl$alter table pgque.slot_lease add column sl_session integer$ddl$);

-- lease_orphan: when a claim first found a lease's bound session gone
-- (lo_sub, lo_epoch and lo_session name the lease and the session). Only
-- appended to by claim_slot, and deleted from with SKIP LOCKED, so a
-- claim left open in a transaction makes no other wait; no foreign key,
-- so neither does an unsubscribe. Rows are few: one per dead holder's
-- slot, gone with the takeover, or after a day.
create table if not exists pgque.lease_orphan (
    lo_sub     integer not null,
    lo_epoch   bigint not null,
    lo_session integer not null,
    lo_seen    timestamptz not null
);
select pgque._create_index('lease_orphan_sub_idx', $ddl$create index lease_orphan_sub_idx
    on pgque.lease_orphan (lo_sub, lo_epoch)$ddl$);

-- key_block: under the pause policy, one row per blocked key of a slot
-- (never per healthy event). State "blocked": kb_head failed and awaits its
-- retry; every other event of the key is deferred. State "releasing": the
-- deferred events were put back (up to kb_wait) and are being delivered in
-- ev_id order; newer events of the key are still deferred. The state
-- resolves when the event kb_wait, handed out in batch kb_wait_batch, is
-- acknowledged (or the head is dead-lettered). kb_kid is the key with NULL
-- spelled distinctly (pgque._kid: 'n' for NULL, 'k' || key, or a hash of a
-- long key); it is also the deferral group.
create table if not exists pgque.key_block (
    kb_sub        integer not null references pgque.subscription (sub_id) on delete cascade,
    kb_kid        text not null,
    kb_key        text,
    kb_state      text not null check (kb_state in ('blocked', 'releasing')),
    kb_head       bigint not null,
    kb_wait       bigint not null,
    kb_wait_batch bigint,
    kb_since      timestamptz not null default now(),
    kb_failures   integer not null default 0,
    kb_reason     text,
    primary key (kb_sub, kb_kid)
);

-- index_ddl: one row, whose lock is the right to build and drop event
-- table indexes (_index_ddl_lock). A table of its own, so that no other
-- work (create_queue waits for pgque.version's row) shares the lock. No
-- role is granted anything on it, so none can lock it.
create table if not exists pgque.index_ddl (
    singleton boolean primary key default true check (singleton)
);
insert into pgque.index_ddl default values on conflict do nothing;
