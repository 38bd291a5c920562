-- pgque 0.1.0 install script; apply in one transaction (psql -1 -f).
set local client_min_messages = warning;

-- ==== engine/structure/preflight.sql ====
-- Install preflight: refuse to install into a schema pgque that someone
-- else prepared.
--
-- A role with CREATE on the database can create schema pgque before the
-- first install and plant objects in it (a trigger on pgque.version, a
-- function the script would "create or replace" but not own, ...): the
-- script would then run the planted code as the installing role. So the
-- script goes on only when schema pgque is absent, or is owned by the
-- installing role and holds nothing owned by another role, and nobody but
-- its owner may create objects in it.
--
-- A superuser re-installing (upgrading) a schema that another role owns
-- becomes that owner for the rest of the transaction (SET LOCAL ROLE), so
-- an upgrade never hands objects, or SECURITY DEFINER functions, to a
-- superuser, and grants the owner made stay in place.
select pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

do $preflight$
declare
    v_nsp   oid;
    v_owner oid;
    v_me    oid := (select oid from pg_catalog.pg_roles where rolname = current_user);
    v_bad   text;
begin
    select n.oid, n.nspowner into v_nsp, v_owner from pg_catalog.pg_namespace n where n.nspname = 'pgque';
    if not found then
        return;
    end if;
    if v_owner operator(pg_catalog.<>) v_me then
        if (select rolsuper from pg_catalog.pg_roles where oid = v_me) then
            execute pg_catalog.format('set local role %I', v_owner::regrole::text);
        else
            raise exception using
                errcode = '42501',
                message = pg_catalog.format('schema pgque is owned by role %s, not by the installing role %s: refusing to install into it',
                                            v_owner::regrole::text, current_user),
                hint = 'install as the owner of schema pgque, or drop the schema if you did not create it';
        end if;
    end if;
    select pg_catalog.string_agg(what, ', ' order by what) into v_bad from (
        select pg_catalog.format('relation %s (owner %s)', c.oid::regclass::text, c.relowner::regrole::text) as what
          from pg_catalog.pg_class c where c.relnamespace = v_nsp and c.relowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('function %s (owner %s)', p.oid::regprocedure::text, p.proowner::regrole::text)
          from pg_catalog.pg_proc p where p.pronamespace = v_nsp and p.proowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('type %s (owner %s)', t.oid::regtype::text, t.typowner::regrole::text)
          from pg_catalog.pg_type t where t.typnamespace = v_nsp and t.typowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('operator %s (owner %s)', o.oid::regoperator::text, o.oprowner::regrole::text)
          from pg_catalog.pg_operator o where o.oprnamespace = v_nsp and o.oprowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('operator class %s (owner %s)', o.opcname, o.opcowner::regrole::text)
          from pg_catalog.pg_opclass o where o.opcnamespace = v_nsp and o.opcowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('operator family %s (owner %s)', o.opfname, o.opfowner::regrole::text)
          from pg_catalog.pg_opfamily o where o.opfnamespace = v_nsp and o.opfowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('collation %s (owner %s)', o.collname, o.collowner::regrole::text)
          from pg_catalog.pg_collation o where o.collnamespace = v_nsp and o.collowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('conversion %s (owner %s)', o.conname, o.conowner::regrole::text)
          from pg_catalog.pg_conversion o where o.connamespace = v_nsp and o.conowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('text search configuration %s (owner %s)', o.cfgname, o.cfgowner::regrole::text)
          from pg_catalog.pg_ts_config o where o.cfgnamespace = v_nsp and o.cfgowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('text search dictionary %s (owner %s)', o.dictname, o.dictowner::regrole::text)
          from pg_catalog.pg_ts_dict o where o.dictnamespace = v_nsp and o.dictowner operator(pg_catalog.<>) v_owner
        union all
        select pg_catalog.format('statistics object %s (owner %s)', o.stxname, o.stxowner::regrole::text)
          from pg_catalog.pg_statistic_ext o where o.stxnamespace = v_nsp and o.stxowner operator(pg_catalog.<>) v_owner
        union all
        -- pgque defines no rules, and no triggers but the two guards of
        -- pgque.table_source (api layer), which call pgque's own guard
        -- function: any other is foreign.
        select pg_catalog.format('trigger %s on %s', g.tgname, g.tgrelid::regclass::text)
          from pg_catalog.pg_trigger g join pg_catalog.pg_class c on c.oid = g.tgrelid
         where c.relnamespace = v_nsp and not g.tgisinternal
           and not (c.relname operator(pg_catalog.=) 'table_source'
                    and g.tgname operator(pg_catalog.=) any (array['pgque_table_source_guard', 'pgque_table_source_drop_function']::pg_catalog.name[])
                    and g.tgfoid operator(pg_catalog.=) pg_catalog.to_regprocedure('pgque._table_source_row_guard()'))
        union all
        select pg_catalog.format('rule %s on %s', r.rulename, r.ev_class::regclass::text)
          from pg_catalog.pg_rewrite r join pg_catalog.pg_class c on c.oid = r.ev_class
         where c.relnamespace = v_nsp and c.relkind operator(pg_catalog.<>) 'v'
        union all
        select pg_catalog.format('CREATE on schema pgque granted to %s',
                                 case when a.grantee operator(pg_catalog.=) 0 then 'PUBLIC' else a.grantee::regrole::text end)
          from pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
         where n.oid = v_nsp and a.privilege_type operator(pg_catalog.=) 'CREATE' and a.grantee operator(pg_catalog.<>) v_owner
    ) foreign_objects;
    if v_bad is not null then
        raise exception using
            errcode = '42501',
            message = pg_catalog.format('schema pgque holds objects or privileges pgque did not create: %s; refusing to install', v_bad),
            hint = 'drop them (or the schema), then install again';
    end if;
end
$preflight$;


-- ==== engine/structure/roles.sql ====
-- The install script runs with a pinned search_path: column defaults,
-- CHECK constraints and views bind their functions and operators when they
-- are created, so a role whose search_path puts public before pg_catalog
-- would otherwise bind them to whatever an attacker planted in public
-- (public.now(), public.=(text,text), ...), to run later as the owner.
select pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

-- Roles.
--
-- pgque_reader consumes, pgque_writer produces, pgque_admin does both plus
-- DDL and maintenance. Roles are cluster-wide: they are created here only
-- when missing, which needs CREATEROLE. An owner without CREATEROLE can
-- install once a DBA has created the three roles (NOLOGIN is enough).
do $roles$
declare
    r text;
begin
    foreach r in array array['pgque_reader', 'pgque_writer', 'pgque_admin'] loop
        if not exists (select 1 from pg_catalog.pg_roles where rolname = r) then
            begin
                execute pg_catalog.format('create role %I nologin', r);
            exception when insufficient_privilege then
                raise exception using
                    errcode = '42501',
                    message = pg_catalog.format('role %s does not exist and the installing role may not create it', r),
                    hint = 'create the roles pgque_reader, pgque_writer and pgque_admin first (CREATE ROLE ... NOLOGIN), or install as a role with CREATEROLE';
            when unique_violation or duplicate_object then
                -- The installer of another database of the cluster created
                -- it meanwhile (the install lock is per database): it exists.
                null;
            end;
        end if;
    end loop;
end
$roles$;

create schema if not exists pgque;
revoke all on schema pgque from public;
grant usage on schema pgque to pgque_reader, pgque_writer, pgque_admin;


-- ==== engine/structure/ddl.sql ====
-- Upgrade helpers for the structure files.
--
-- Re-applying the install upgrades in place while workers run, so a
-- structure statement must not lock a table that is already as it should
-- be. ALTER TABLE ... ADD COLUMN IF NOT EXISTS takes an ACCESS EXCLUSIVE
-- lock and CREATE INDEX IF NOT EXISTS a SHARE lock before they look for
-- the column or index: held to the end of the install transaction, the
-- first blocks every consumer and the second every producer, and either
-- can deadlock with a worker's transaction that already holds a lock on
-- another pgque table. These helpers look in the catalog first and run the
-- statement only when there is something to create. The statements are
-- constants of the install script, never caller input. Not granted.

-- _add_column(table, column, ddl): runs ddl (an ALTER TABLE ... ADD
-- COLUMN) unless table already has column.
create or replace function pgque._add_column(i_table regclass, i_column text, i_ddl text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pg_catalog.pg_attribute
                    where attrelid = i_table and attname = i_column and not attisdropped) then
        execute i_ddl;
    end if;
end;
$$;

-- _create_index(index, ddl): runs ddl (a CREATE INDEX) unless schema pgque
-- already has a relation named index.
create or replace function pgque._create_index(i_index text, i_ddl text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                    where n.nspname = 'pgque' and c.relname = i_index) then
        execute i_ddl;
    end if;
end;
$$;

-- _create_view(view, ddl): runs ddl (a CREATE OR REPLACE VIEW of
-- pgque.view) unless the view was last made by this very ddl. CREATE OR
-- REPLACE VIEW takes an ACCESS EXCLUSIVE lock on the view even when nothing
-- changes: it waits for every reader of the view (a status poll that is
-- itself waiting behind maint's TRUNCATE of an event table is enough for a
-- deadlock) and stops every reader that comes after it. The md5 of the ddl
-- is kept as the view's comment, which only its owner can set.
create or replace function pgque._create_view(i_view text, i_ddl text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_mark text := 'pgque view, ddl md5 ' || md5(i_ddl);
    v_oid oid;
begin
    select c.oid into v_oid from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where n.nspname = 'pgque' and c.relname = i_view and c.relkind = 'v';
    if v_oid is not null and obj_description(v_oid, 'pg_class') is not distinct from v_mark then
        return;
    end if;
    execute i_ddl;
    execute format('comment on view pgque.%I is %L', i_view, v_mark);
end;
$$;

-- _revoke_public_relations(): "revoke all on all tables (and sequences) in
-- schema pgque from public", done only to the relations where PUBLIC holds
-- something. The blanket statement rewrites the pg_class row of every
-- table, event tables included, and keeps it locked to the end of the
-- install transaction; maint's TRUNCATE of an event table rewrites that row
-- too, so it waits for the install while holding an ACCESS EXCLUSIVE lock
-- on the table that readers queue behind: a deadlock as soon as the install
-- waits for one of those readers.
create or replace function pgque._revoke_public_relations()
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r record;
begin
    for r in
        select c.oid::regclass::text as rel, c.relkind
          from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
         where n.nspname = 'pgque' and c.relkind in ('r', 'p', 'v', 'm', 'f', 'S')
           and exists (select 1 from pg_catalog.aclexplode(c.relacl) a where a.grantee = 0)
    loop
        execute format('revoke all on %s %s from public',
                       case when r.relkind = 'S' then 'sequence' else 'table' end, r.rel);
    end loop;
end;
$$;

-- _grant_select(relations, roles): GRANT SELECT on each relation to each
-- role that does not hold it yet (see _revoke_public_relations for why).
create or replace function pgque._grant_select(i_rels regclass[], i_roles regrole[])
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_rel regclass;
    v_role regrole;
begin
    foreach v_rel in array i_rels loop
        foreach v_role in array i_roles loop
            if not exists (select 1 from pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                            where c.oid = v_rel and a.grantee = v_role and a.privilege_type = 'SELECT') then
                execute format('grant select on table %s to %s', v_rel, v_role);
            end if;
        end loop;
    end loop;
end;
$$;

revoke all on function pgque._add_column(regclass, text, text), pgque._create_index(text, text),
    pgque._create_view(text, text), pgque._revoke_public_relations(), pgque._grant_select(regclass[], regrole[]) from public;


-- ==== engine/structure/tables.sql ====
-- Engine tables.
--
-- Event storage is one list-partitioned table, pgque.event: every queue owns
-- a fixed number (queue_ntables, 3) of partitions used round-robin, named
-- event_<queue_id>_<n> and holding ev_part = queue_id * 16 + n. Producers
-- only ever INSERT into it; rotation reclaims space by TRUNCATE of a whole
-- partition. No row of an event table is ever updated or deleted.
--
-- Nothing is updated or deleted per tick, batch or chunk: the subscription
-- row is a static anchor (locked, never updated, while consuming) and the
-- state that moves is appended to pgque.sub_state (see structure/state.sql).

create table if not exists pgque.version (
    singleton    boolean primary key default true check (singleton),
    version      text not null,
    installed_at timestamptz not null default now()
);

create table if not exists pgque.queue (
    queue_id                 integer primary key,
    queue_name               text not null unique,
    queue_ntables            integer not null default 3,
    queue_cur_table          integer not null default 0,
    queue_event_seq          regclass not null,
    queue_rotation_period    interval not null default '2 hours',
    queue_switch_time        timestamptz not null default now(),
    queue_ticker_max_count   integer not null default 500,
    queue_ticker_max_lag     interval not null default '10 milliseconds',
    queue_ticker_idle_period interval not null default '60 seconds',
    queue_max_retries        integer not null default 5,
    queue_created            timestamptz not null default now()
);

create sequence if not exists pgque.queue_id_seq;
create sequence if not exists pgque.tick_id_seq;
create sequence if not exists pgque.batch_id_seq;
create sequence if not exists pgque.subscription_id_seq maxvalue 1048575;
-- Subscription ids are 20 bits (batch ids embed them) and are reused: the
-- sequence cycles (register_consumer skips ids still in use).
do $cycle$
begin
    if not (select seqcycle from pg_catalog.pg_sequence where seqrelid = 'pgque.subscription_id_seq'::regclass) then
        alter sequence pgque.subscription_id_seq cycle;
    end if;
end
$cycle$;

-- The parent of every queue's event tables. ev_txid is the producing
-- transaction; batches are cut by comparing it with tick snapshots.
create table if not exists pgque.event (
    ev_id     bigint not null,
    ev_time   timestamptz not null default now(),
    ev_txid   xid8 not null default pg_current_xact_id(),
    ev_part   integer not null,
    ev_owner  integer,
    ev_retry  integer,
    ev_type   text,
    ev_data   text,
    ev_extra1 text,
    ev_extra2 text,
    ev_extra3 text,
    ev_extra4 text
) partition by list (ev_part);

-- (ev_txid, ev_id): a batch is its ev_txid ranges, and ev_id, its order,
-- in the index lets a chunk of a large batch be read from the index
-- alone (see "Large batches" in docs/design.md). Installs before it had
-- (ev_txid) only: the first install of this version builds the new index
-- on every event table (a SHARE lock each: sends wait for the build) and
-- drops the old one.
select pgque._create_index('event_txid_id_idx', $ddl$create index event_txid_id_idx on pgque.event (ev_txid, ev_id)$ddl$);
drop index if exists pgque.event_txid_idx;

-- ev_dedup: an idempotency key, unique within an event table (the
-- partial index holds no entry for the NULL of an event without one).
-- The api layer's dedup keys live here (api/structure/dedup.sql): a keyed
-- send writes its key into its own event row, and that index is the
-- lookup.
select pgque._add_column('pgque.event', 'ev_dedup', $ddl$alter table pgque.event add column ev_dedup text$ddl$);
select pgque._create_index('event_dedup_idx',
    $ddl$create unique index event_dedup_idx on pgque.event (ev_part, ev_dedup) where ev_dedup is not null$ddl$);

-- Earlier versions gave every partition a CHECK (ev_part = n) so that
-- ATTACH PARTITION would not scan it. The partition constraint says the
-- same, and a CHECK costs every INSERT a parse and plan of its expression
-- (about 6% of a send's server instructions), so it is dropped.
do $drop_part_checks$
declare
    c record;
begin
    for c in select con.conrelid::regclass as tbl, con.conname
               from pg_catalog.pg_constraint con
               join pg_catalog.pg_inherits i on i.inhrelid = con.conrelid
              where i.inhparent = 'pgque.event'::regclass and con.contype = 'c'
                and con.conname like 'event\_%\_part'
    loop
        execute format('alter table %s drop constraint %I', c.tbl, c.conname);
    end loop;
end
$drop_part_checks$;

-- Ticks (pgque.tick) and the delivery state log (pgque.sub_state) live in
-- structure/state.sql: both are append-only and reclaimed by TRUNCATE.

-- A subscription is (queue, consumer): a static row, locked while its state
-- changes but never updated. sub_last_tick is its cursor at registration;
-- sub_next_tick, sub_batch and sub_active are only read once, by the
-- install that moves state written in place by earlier versions into
-- pgque.sub_state. The current cursor and open batch are the
-- subscription's newest sub_state record. Batch ids embed
-- sub_id in their low 20 bits, so a batch's subscription is found from the
-- id alone.
create table if not exists pgque.subscription (
    sub_id         integer primary key,
    sub_queue      integer not null references pgque.queue (queue_id) on delete cascade,
    sub_name       text not null,
    sub_last_tick  bigint not null,
    sub_next_tick  bigint,
    sub_batch      bigint,
    sub_active     timestamptz not null default now(),
    sub_registered timestamptz not null default now(),
    unique (sub_queue, sub_name)
) with (fillfactor = 50);

-- queue_retired[n + 1]: when table n last stopped being current (NULL
-- while it is current, and for a table never current since this column
-- exists). Written by rotation only, with queue_switch_time, which is
-- therefore the newest of these times. Every row of a retired table was
-- written by a transaction that began before that time: a layer that must
-- keep a table's rows for a while after its last write (the dedup keys of
-- the api layer) reads its age from here (see the 'rotate' hooks).
select pgque._add_column('pgque.queue', 'queue_retired', $ddl$alter table pgque.queue add column queue_retired timestamptz[]$ddl$);

-- queue_dedup_window: how long the queue remembers a dedup key (NULL: 5
-- minutes). Set through set_queue_config(queue, 'dedup_window', ...) by
-- the api layer, which gives it its meaning; kept in the queue row, which
-- every send reads anyway.
select pgque._add_column('pgque.queue', 'queue_dedup_window', $ddl$alter table pgque.queue add column queue_dedup_window interval$ddl$);

-- sub_until_tick: when set, the subscription is sealed at that tick and
-- never opens a batch past it (see _open_batch). Written once per online
-- resize of a slot group, never while consuming.
select pgque._add_column('pgque.subscription', 'sub_until_tick', $ddl$alter table pgque.subscription add column sub_until_tick bigint$ddl$);

-- Events set aside by event_retry until ev_retry_after, for one subscription.
create table if not exists pgque.retry_queue (
    ev_owner       integer not null references pgque.subscription (sub_id) on delete cascade,
    ev_id          bigint not null,
    ev_queue       integer not null,
    ev_retry_after timestamptz not null,
    ev_time        timestamptz not null,
    ev_retry       integer not null,
    ev_type        text,
    ev_data        text,
    ev_extra1      text,
    ev_extra2      text,
    ev_extra3      text,
    ev_extra4      text,
    primary key (ev_owner, ev_id)
);
select pgque._create_index('retry_queue_due_idx', $ddl$create index retry_queue_due_idx on pgque.retry_queue (ev_retry_after)$ddl$);

-- Events that failed more than the queue's max_retries times.
create table if not exists pgque.dead_letter (
    dl_id       bigint generated always as identity primary key,
    dl_queue    integer not null references pgque.queue (queue_id) on delete cascade,
    dl_consumer text not null,
    dl_time     timestamptz not null default now(),
    dl_reason   text,
    ev_id       bigint not null,
    ev_time     timestamptz not null,
    ev_txid     xid8,
    ev_retry    integer not null,
    ev_type     text,
    ev_data     text,
    ev_extra1   text,
    ev_extra2   text,
    ev_extra3   text,
    ev_extra4   text
);
select pgque._create_index('dead_letter_consumer_idx', $ddl$create index dead_letter_consumer_idx on pgque.dead_letter (dl_queue, dl_consumer, dl_id)$ddl$);

-- The single ticker lease: whichever ticker daemon holds it ticks. The
-- row changes only when its owner does (a takeover, a resignation), so that
-- a held xmin horizon does not pile up a dead version per renewal:
-- lease_until is the expiry the claim set, and a renewal moves
-- ticker_beat_seq to the renewed expiry in milliseconds since 1970 (a
-- sequence changes in place and makes no row version). The lease lives
-- until the later of the two (_ticker_expiry).
create table if not exists pgque.ticker_lease (
    singleton   boolean primary key default true check (singleton),
    owner       text,
    lease_until timestamptz,
    epoch       bigint not null default 0
);
create sequence if not exists pgque.ticker_beat_seq;

-- Events set aside by event_defer for one subscription, in groups, without
-- counting a retry. event_undefer puts a group back into the log (same
-- ev_id, same ev_retry) where only that subscription sees it, so a group is
-- re-delivered in ev_id order. Rows exist only while deferred; nothing here
-- is written for events that are never deferred.
create table if not exists pgque.deferred (
    ev_owner    integer not null references pgque.subscription (sub_id) on delete cascade,
    ev_id       bigint not null,
    ev_group    text not null,
    ev_queue    integer not null,
    ev_time     timestamptz not null,
    ev_retry    integer,
    ev_type     text,
    ev_data     text,
    ev_extra1   text,
    ev_extra2   text,
    ev_extra3   text,
    ev_extra4   text,
    deferred_at timestamptz not null default now(),
    primary key (ev_owner, ev_id)
);
select pgque._create_index('deferred_group_idx', $ddl$create index deferred_group_idx on pgque.deferred (ev_owner, ev_group, ev_id)$ddl$);

-- Hooks by which the layers above the engine add their own per-queue
-- settings and maintenance without the engine knowing what they are:
-- set_queue_config hands a parameter it does not know to the 'queue_config'
-- hook of that name, called as fn(queue_id integer, value text); maint()
-- calls every 'maint' hook as fn() returning integer (operations done);
-- rotation asks every 'rotate' hook, as fn(queue_id integer, table_no
-- integer) returning text, whether it may truncate that table (NULL: yes;
-- otherwise why not). Written only by the install; the functions named are
-- the owner's.
create table if not exists pgque.layer_hook (
    hook_kind text not null check (hook_kind in ('queue_config', 'maint', 'rotate')),
    hook_name text not null,
    hook_fn   regprocedure not null,
    primary key (hook_kind, hook_name)
);

-- The 'rotate' hook kind is newer than the table: widen the check of an
-- older install (only then: ALTER TABLE locks the table).
do $hook_kinds$
begin
    if not exists (select 1 from pg_catalog.pg_constraint
                    where conrelid = 'pgque.layer_hook'::regclass and contype = 'c'
                      and pg_catalog.pg_get_constraintdef(oid) like '%rotate%') then
        alter table pgque.layer_hook drop constraint if exists layer_hook_hook_kind_check;
        alter table pgque.layer_hook add constraint layer_hook_hook_kind_check
            check (hook_kind in ('queue_config', 'maint', 'rotate'));
    end if;
end
$hook_kinds$;


-- ==== engine/structure/state.sql ====
-- Append-only delivery state: ticks and the subscription state log.
--
-- Under a held xmin horizon (a REPEATABLE READ transaction, pg_dump,
-- hot_standby_feedback) no dead row version can be pruned, so anything
-- updated or deleted per tick, batch or chunk piles up and slows every
-- read. Ticks and subscription state are therefore only ever INSERTed, into
-- tables list-partitioned by a generation (0 or 1). A sequence per family
-- names the generation new rows go to (its value modulo 2; a sequence is
-- changed in place, so moving it makes no row version). maint() moves it
-- and, under an ACCESS EXCLUSIVE lock on the partition being retired,
-- copies the rows still needed into the other partition and TRUNCATEs the
-- retired one (see _state_flip and _tick_flip in functions/pgque.maint.sql).
-- Space is reclaimed by TRUNCATE only, as for event tables.

-- rotation: one row per flipped family, never updated: flips lock it so
-- that two maint() calls never flip the same family at once.
create table if not exists pgque.rotation (
    rot_name text primary key check (rot_name in ('tick', 'state'))
);
insert into pgque.rotation (rot_name) values ('tick'), ('state') on conflict (rot_name) do nothing;
create sequence if not exists pgque.tick_gen_seq;
create sequence if not exists pgque.state_gen_seq;

-- _gen(name): the generation ('tick' or 'state') new rows go to. It is the
-- column default of tick_gen and st_gen, so inserting code names no
-- partition. Inlined into the INSERT that evaluates it (no SET clause, and
-- volatile, as pg_sequence_last_value is, so the planner may): a SQL
-- function that is not inlined is planned again at every call, which cost
-- each state record about 10 us. Every name in the body is qualified, as
-- in any function without a pinned search_path.
create or replace function pgque._gen(i_name text)
returns integer language sql volatile
as $$
    select (coalesce(pg_catalog.pg_sequence_last_value(
                case i_name when 'tick' then 'pgque.tick_gen_seq'::pg_catalog.regclass
                            else 'pgque.state_gen_seq'::pg_catalog.regclass end), 0)
            operator(pg_catalog.%) 2)::integer
$$;

-- A tick is a queue position: the snapshot and event sequence at a moment.
-- tick_id is unique (a sequence); during a flip a needed tick is copied
-- to the other generation before its old copy is truncated, so the index
-- is not unique.
do $tick$
begin
    -- Installs before the append-only design kept ticks in a plain table,
    -- cleaned up with DELETE: move its rows into the partitioned one.
    if exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'pgque' and c.relname = 'tick' and c.relkind = 'r') then
        alter table pgque.tick rename to tick_plain;
        alter table pgque.tick_plain rename constraint tick_pkey to tick_plain_pkey;
    end if;
end
$tick$;

create table if not exists pgque.tick (
    tick_queue     integer not null,
    tick_id        bigint not null,
    tick_time      timestamptz not null,
    tick_snapshot  pg_snapshot not null,
    tick_event_seq bigint not null,
    tick_gen       integer not null default pgque._gen('tick')
) partition by list (tick_gen);
create table if not exists pgque.tick_0 partition of pgque.tick for values in (0);
create table if not exists pgque.tick_1 partition of pgque.tick for values in (1);
select pgque._create_index('tick_queue_id_idx', $ddl$create index tick_queue_id_idx on pgque.tick (tick_queue, tick_id)$ddl$);

-- tick_xid: the ticker's transaction id, when it was assigned after the
-- ticker read the event sequence and the sequence had not moved by the
-- time the tick was written (NULL otherwise, and in ticks written before
-- the column existed). Every producer takes its transaction id before its
-- event ids, so a transaction holding an ev_id the tick covers has a
-- transaction id below tick_xid: once no transaction below it is running,
-- no event the tick's snapshot missed can still commit (see _tick_due).
select pgque._add_column('pgque.tick', 'tick_xid',
    $ddl$alter table pgque.tick add column tick_xid xid8$ddl$);

do $tick$
declare
    f regprocedure;
begin
    if exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'pgque' and c.relname = 'tick_plain') then
        insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq)
        select tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq from pgque.tick_plain;
        -- Functions taking the old row type (their files create them again
        -- later in this install) would keep the old table alive.
        for f in select d.objid::regprocedure
                   from pg_catalog.pg_depend d
                  where d.classid = 'pg_catalog.pg_proc'::regclass
                    and d.refclassid = 'pg_catalog.pg_type'::regclass
                    and d.refobjid = (select c.reltype from pg_catalog.pg_class c
                                       where c.oid = 'pgque.tick_plain'::regclass) loop
            execute format('drop function %s', f);
        end loop;
        drop table pgque.tick_plain;
    end if;
end
$tick$;

-- sub_state: the subscription state log. Every change of a subscription's
-- cursor, open batch or chunk progress appends one record; the current state
-- is the record with the highest st_seq (index (st_sub, st_seq desc),
-- limit 1); register_consumer appends the first. Writers hold the
-- subscription row's lock
-- (FOR NO KEY UPDATE: a lock marks the row in place and makes no version),
-- so records of one subscription are appended one at a time, in st_seq
-- order. Records of dropped subscriptions are simply not carried over by
-- the next flip (subscription ids are never reused).
--   st_last_tick      the cursor: the batch's first tick, or the last tick consumed
--   st_next_tick      the open batch's last tick (NULL: no batch open)
--   st_batch          the open batch id (NULL: none)
--   st_acked_to       last ev_id of the open batch acknowledged (NULL: none yet)
--   st_delivered_to   last ev_id handed out by the last receive (NULL: none pending)
--   st_delivered_all  the last receive reached the batch's end
create sequence if not exists pgque.sub_state_seq;
create table if not exists pgque.sub_state (
    st_sub           integer not null,
    st_seq           bigint not null,
    st_time          timestamptz not null default now(),
    st_last_tick     bigint not null,
    st_next_tick     bigint,
    st_batch         bigint,
    st_acked_to      bigint,
    st_delivered_to  bigint,
    st_delivered_all boolean not null default false,
    st_gen           integer not null default pgque._gen('state')
) partition by list (st_gen);
create table if not exists pgque.sub_state_0 partition of pgque.sub_state for values in (0);
create table if not exists pgque.sub_state_1 partition of pgque.sub_state for values in (1);
select pgque._create_index('sub_state_sub_idx', $ddl$create index sub_state_sub_idx on pgque.sub_state (st_sub, st_seq desc)$ddl$);

-- st_moved: when the state last moved (a cursor, batch or chunk change).
-- A heartbeat copy (_touch_state) keeps the copied record's st_moved and
-- takes a new st_time, so "renewed but made no progress" can be told apart
-- from "consumed" (pgque.partition_slot_stalls). Added after the table, so
-- that old and new installs have the same column order; NULL in records
-- written before it existed means st_time. Guarded by the catalog:
-- ALTER TABLE locks the table before it looks, and a re-install must not
-- take an exclusive lock on the state log of running consumers.
select pgque._add_column('pgque.sub_state', 'st_moved',
    $ddl$alter table pgque.sub_state add column st_moved timestamptz$ddl$);

-- Subscriptions registered by versions that kept their state in the
-- subscription row get their first record from it.
insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch)
select s.sub_id, nextval('pgque.sub_state_seq'), s.sub_active, s.sub_last_tick, s.sub_next_tick, s.sub_batch
  from pgque.subscription s
 where not exists (select 1 from pgque.sub_state x where x.st_sub = s.sub_id);


-- ==== engine/structure/access.sql ====
-- Per-queue confinement (the multi-tenant model, docs/security.md).
--
-- The pgque_* roles are cluster-wide and, on their own, let every reader
-- consume every queue and every writer produce into every queue of every
-- database that has pgque. A queue can be confined per action: once an
-- admin grants 'consume' (or 'produce') on a queue to some role, only
-- logins that are members of a granted role may do that on that queue.
-- queue_confined lists the confined actions, so that an unconfined queue
-- costs producers nothing (it is read with the queue row they read
-- anyway). Grants live in this database only.
-- Through _add_column (structure/ddl.sql): a re-install must not lock the
-- queue table of running producers.
select pgque._add_column('pgque.queue', 'queue_confined',
    $ddl$alter table pgque.queue add column queue_confined text[] not null default '{}'$ddl$);

create table if not exists pgque.queue_grant (
    qg_queue  integer not null references pgque.queue (queue_id) on delete cascade,
    qg_action text not null check (qg_action in ('consume', 'produce')),
    qg_role   oid not null,
    primary key (qg_queue, qg_action, qg_role)
);


-- ==== engine/functions/pgque._util.sql ====
-- Internal helpers shared by the engine functions. None of them is granted
-- to any role: they run inside SECURITY DEFINER functions that already pin
-- search_path, and they only use schema-qualified names.

-- _record_version(version): records the installed schema version.
create or replace function pgque._record_version(i_version text)
returns void language sql
set search_path = pg_catalog, pg_temp
as $$
    insert into pgque.version (singleton, version, installed_at)
    values (true, i_version, pg_catalog.now())
    on conflict (singleton) do update set version = excluded.version, installed_at = excluded.installed_at;
$$;

-- _not_null(what, value): raises 22004 naming the argument when value is NULL.
create or replace function pgque._not_null(i_what text, i_value anyelement)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_value is null then
        raise exception using errcode = '22004', message = format('%s must not be NULL', i_what);
    end if;
end;
$$;

-- _check_name(kind, name): validates a queue or consumer name: 1..63
-- bytes of letters, digits and '_', '.', ':', '#', '/', '-', not starting
-- with punctuation. Raises 22004 for NULL and PQ010 otherwise. (Layers
-- above may reserve some of these characters for names they generate.)
drop function if exists pgque._check_name(text, text, boolean);
create or replace function pgque._check_name(i_kind text, i_name text)
returns text language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_name is null then
        raise exception using errcode = '22004', message = format('%s name must not be NULL', i_kind);
    end if;
    if i_name = '' then
        raise exception using errcode = 'PQ010', message = format('%s name must not be empty', i_kind);
    end if;
    if octet_length(i_name) > 63 then
        raise exception using errcode = 'PQ010',
            message = format('%s name %s… is %s bytes long; the limit is 63', i_kind,
                             quote_literal(left(i_name, 40)), octet_length(i_name));
    end if;
    if i_name !~ '^[A-Za-z0-9_][A-Za-z0-9_.:#/-]*$' then
        raise exception using errcode = 'PQ010',
            message = format('invalid %s name %L: use letters, digits, "_", ".", ":" and "-", starting with a letter, digit or "_"', i_kind, i_name);
    end if;
    return i_name;
end;
$$;

-- _queue(name): the queue row, or PQ001 (22004 for NULL).
create or replace function pgque._queue(i_queue text)
returns pgque.queue language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue;
begin
    select * into q from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    return q;
end;
$$;

-- _raise_no_queue(name): raises 22004 for NULL, PQ001 otherwise.
create or replace function pgque._raise_no_queue(i_queue text)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_queue is null then
        raise exception using errcode = '22004', message = 'queue name must not be NULL';
    end if;
    raise exception using errcode = 'PQ001', message = format('queue %L does not exist', i_queue);
end;
$$;

-- _subscription(queue, consumer): the subscription row with its current
-- state (cursor, open batch: see _with_state), or PQ001/PQ002.
create or replace function pgque._subscription(i_queue text, i_consumer text)
returns pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription;
begin
    select s1.* into s
      from pgque.subscription s1 join pgque.queue q on q.queue_id = s1.sub_queue
     where q.queue_name = i_queue and s1.sub_name = i_consumer;
    if not found then
        perform pgque._queue(i_queue);
        perform pgque._not_null('consumer name', i_consumer);
        raise exception using errcode = 'PQ002',
            message = format('consumer %L is not subscribed to queue %L', i_consumer, i_queue);
    end if;
    return pgque._with_state(s);
end;
$$;

-- _event_table(queue_id, n): the name of a queue's n-th event table. No
-- SET clause, every name qualified instead: a SET keeps a SQL function
-- from being inlined, and each call then planned its body again (a keyed
-- send that found its key in a table paid for that on every call).
create or replace function pgque._event_table(i_queue_id integer, i_n integer)
returns text language sql immutable
as $$ select 'pgque.' operator(pg_catalog.||) pg_catalog.quote_ident('event_' operator(pg_catalog.||)
          i_queue_id::pg_catalog.text operator(pg_catalog.||) '_' operator(pg_catalog.||) i_n::pg_catalog.text) $$;


-- ==== engine/functions/pgque._state.sql ====
-- Reading and appending subscription state (pgque.sub_state).
--
-- The current state of a subscription is its newest sub_state record
-- (register_consumer appends the first). Appending requires the
-- subscription row's lock (_lock_sub), so the newest record is always the
-- last one appended. None of these functions is granted to any role.
--
-- Every function that reads sub_state or tick is VOLATILE: a volatile
-- PL/pgSQL statement takes its table locks before its snapshot, so a
-- statement that waited for a flip's ACCESS EXCLUSIVE lock sees the rows
-- the flip copied. (A STABLE function reads with its caller's snapshot,
-- which may predate the flip: TRUNCATE is not MVCC-safe, and the retired
-- partition would look empty.)

-- _sub_state(sub_id): the subscription's current state. Tables:
-- sub_state, subscription (read). A NULL record when the subscription does
-- not exist. A subscription whose records are all invisible can only be
-- read by a transaction snapshot older than the last flip (REPEATABLE READ
-- or SERIALIZABLE): that is an error (PQ011), never an older state.
create or replace function pgque._sub_state(i_sub integer)
returns pgque.sub_state language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    select * into st from pgque.sub_state where st_sub = i_sub order by st_seq desc limit 1;
    -- Two tests, not one AND: "not found" folds the AND to false in a
    -- custom plan, so the plan cache would never settle on a generic plan
    -- and would plan the subquery at every call.
    if not found then
        if exists (select 1 from pgque.subscription where sub_id = i_sub) then
            raise exception using errcode = 'PQ011',
                message = format('the state of subscription %s is not visible to this transaction''s snapshot; consume in READ COMMITTED', i_sub);
        end if;
    end if;
    return st;
end;
$$;

-- _with_state(subscription): the subscription row with sub_last_tick,
-- sub_next_tick, sub_batch and sub_active taken from its current state.
create or replace function pgque._with_state(s pgque.subscription)
returns pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if s.sub_id is null then
        return s;
    end if;
    st := pgque._sub_state(s.sub_id);
    s.sub_last_tick := st.st_last_tick;
    s.sub_next_tick := st.st_next_tick;
    s.sub_batch := st.st_batch;
    s.sub_active := st.st_time;
    return s;
end;
$$;

-- _lock_sub(sub_id): takes the subscription row's lock, which serialises
-- every change of its state (the receive lock). FOR NO KEY UPDATE does not
-- conflict with the key-share locks foreign keys take (retry_queue,
-- deferred). Returns the current state, read after the lock was granted.
create or replace function pgque._lock_sub(i_sub integer)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    perform 1 from pgque.subscription where sub_id = i_sub for no key update;
    return pgque._sub_state(i_sub);
end;
$$;

-- _put_state(state): appends a state record (st_seq and st_gen are
-- assigned here; the caller holds _lock_sub). Returns the record.
create or replace function pgque._put_state(st pgque.sub_state)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    st.st_seq := nextval('pgque.sub_state_seq');
    st.st_time := clock_timestamp();
    st.st_moved := st.st_time;
    insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                 st_acked_to, st_delivered_to, st_delivered_all, st_moved)
    values (st.st_sub, st.st_seq, st.st_time, st.st_last_tick, st.st_next_tick, st.st_batch,
            st.st_acked_to, st.st_delivered_to, coalesce(st.st_delivered_all, false), st.st_moved);
    return st;
end;
$$;

-- _touch_state(sub_id): appends a copy of the current state with a new
-- st_time, for layers that keep time-bound facts (a heartbeat) in the
-- state's timestamp instead of updating a row. The copy keeps st_moved:
-- a heartbeat is not progress. Tables: sub_state (insert), subscription
-- (lock).
create or replace function pgque._touch_state(i_sub integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state := pgque._lock_sub(i_sub);
begin
    if st.st_sub is not null then
        insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                     st_acked_to, st_delivered_to, st_delivered_all, st_moved)
        values (st.st_sub, nextval('pgque.sub_state_seq'), clock_timestamp(), st.st_last_tick, st.st_next_tick,
                st.st_batch, st.st_acked_to, st.st_delivered_to, st.st_delivered_all,
                coalesce(st.st_moved, st.st_time));
    end if;
end;
$$;


-- ==== engine/functions/pgque.version.sql ====
-- version(): the installed pgque version, for every pgque role (the
-- pgque.version table itself is readable by pgque_admin only). Clients and
-- the CLI call it to check that pgque is installed before anything else.
-- Returns NULL when the version row is missing. Tables: version.
create or replace function pgque.version()
returns text language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$ select v.version from pgque.version v $$;


-- ==== engine/functions/pgque._check_interval.sql ====
-- _check_interval(what, value, min, max): validates a duration argument
-- and returns it as the exact duration it stands for now (days and time,
-- no months).
--
-- Intervals compare with a month counted as 30 days and a year as 360, so
-- '10000 years -3599999 days' compares equal to '1 day' while adding it to
-- now() lands 144 years ahead. The bounds are therefore checked on what the
-- value does: (now + value) - now, a plain duration, against (now + min) -
-- now and (now + max) - now. Values that overflow a timestamp are refused
-- too. Raises 22004 for NULL and PQ011 naming the argument otherwise.
-- Callers (retry delays, lease TTLs, queue config) should use the returned
-- value, which is what was checked. Touches no table.
create or replace function pgque._check_interval(i_what text, i_value interval, i_min interval, i_max interval)
returns interval language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_now timestamptz := clock_timestamp();
    v_dur interval;
begin
    if i_value is null then
        raise exception using errcode = '22004', message = format('%s must not be NULL', i_what);
    end if;
    begin
        v_dur := (v_now + i_value) - v_now;
    exception when datetime_field_overflow or interval_field_overflow or numeric_value_out_of_range then
        raise exception using errcode = 'PQ011',
            message = format('%s %s is out of range: it must be between %s and %s', i_what, i_value, i_min, i_max);
    end;
    if v_dur < (v_now + i_min) - v_now or v_dur > (v_now + i_max) - v_now then
        raise exception using errcode = 'PQ011',
            message = format('%s must be between %s and %s, not %s (%s from now)', i_what, i_min, i_max, i_value, v_dur);
    end if;
    return v_dur;
end;
$$;


-- ==== engine/functions/pgque.authorize.sql ====
-- Access checks for confined queues (see structure/access.sql).
--
-- The caller is identified by session_user, the role that logged in: inside
-- a SECURITY DEFINER function current_user is the owner, and SET ROLE
-- cannot widen what a confined login may do. Superusers pass every check.

-- _authorize_id(queue_id, action): raises 42501 unless the login is a
-- member of a role granted action on the queue. Touches queue_grant.
create or replace function pgque._authorize_id(i_queue_id integer, i_action text)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if not exists (select 1 from pgque.queue_grant g
                    where g.qg_queue = i_queue_id and g.qg_action = i_action
                      and pg_has_role(session_user, g.qg_role, 'MEMBER')) then
        raise exception using errcode = '42501',
            message = format('role %s may not %s on queue %s: the queue is confined to the roles granted with grant_queue',
                             session_user, i_action, (select queue_name from pgque.queue where queue_id = i_queue_id));
    end if;
end;
$$;

-- _authorize(queue, consumer, action): the check consume and produce entry
-- points call first. Does nothing for an unknown queue (the caller raises
-- PQ001 itself) or one not confined for action. consumer is reserved for
-- per-consumer grants and not used yet. Returns true (or raises), so that
-- functions whose declarations already act (take a lease row lock) can
-- run it as their first declaration.
create or replace function pgque._authorize(i_queue text, i_consumer text, i_action text)
returns boolean language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id       integer;
    v_confined text[];
begin
    select queue_id, queue_confined into v_id, v_confined from pgque.queue where queue_name = i_queue;
    if found and i_action = any (v_confined) then
        perform pgque._authorize_id(v_id, i_action);
    end if;
    return true;
end;
$$;

-- _authorize_batch(batch_id, action): _authorize for calls that name a
-- batch (ack, nack): its subscription's queue. Unknown batches pass (the
-- caller raises PQ020).
create or replace function pgque._authorize_batch(i_batch_id bigint, i_action text)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id       integer;
    v_confined text[];
begin
    select q.queue_id, q.queue_confined into v_id, v_confined
      from pgque.subscription s join pgque.queue q on q.queue_id = s.sub_queue
     where s.sub_id = (i_batch_id % 1048576)::integer;
    if found and i_action = any (v_confined) then
        perform pgque._authorize_id(v_id, i_action);
    end if;
end;
$$;

-- _check_action(action): 'consume' or 'produce' (PQ011, 22004).
create or replace function pgque._check_action(i_action text)
returns text language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_action is null then
        raise exception using errcode = '22004', message = 'action must not be NULL';
    end if;
    if i_action not in ('consume', 'produce') then
        raise exception using errcode = 'PQ011', message = format('action must be ''consume'' or ''produce'', not %L', i_action);
    end if;
    return i_action;
end;
$$;

-- _role_oid(role): the role's oid, PQ011 when there is no such role.
create or replace function pgque._role_oid(i_role text)
returns oid language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_oid oid;
begin
    if i_role is null then
        raise exception using errcode = '22004', message = 'role must not be NULL';
    end if;
    select oid into v_oid from pg_roles where rolname = i_role;
    if not found then
        raise exception using errcode = 'PQ011', message = format('role %L does not exist', left(i_role, 80));
    end if;
    return v_oid;
end;
$$;

-- grant_queue(queue, role, action): confines action ('consume' or
-- 'produce') on queue and lets role (and its members) do it. Returns 1
-- when granted, 0 when it already was. Tables: queue_grant, queue.
create or replace function pgque.grant_queue(i_queue text, i_role text, i_action text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    v_role oid := pgque._role_oid(i_role);
begin
    perform pgque._check_action(i_action);
    update pgque.queue set queue_confined = array_append(queue_confined, i_action)
     where queue_id = q.queue_id and not (i_action = any (queue_confined));
    insert into pgque.queue_grant (qg_queue, qg_action, qg_role) values (q.queue_id, i_action, v_role)
    on conflict do nothing;
    return case when found then 1 else 0 end;
end;
$$;

-- revoke_queue(queue, role, action): removes role's grant. The queue stays
-- confined for action (with no grant left, nobody but superusers may do
-- it): lifting confinement is unconfine_queue. Returns 1 when revoked.
create or replace function pgque.revoke_queue(i_queue text, i_role text, i_action text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    v_role oid := pgque._role_oid(i_role);
begin
    perform pgque._check_action(i_action);
    delete from pgque.queue_grant where qg_queue = q.queue_id and qg_action = i_action and qg_role = v_role;
    return case when found then 1 else 0 end;
end;
$$;

-- unconfine_queue(queue, action): lifts confinement of action on queue and
-- drops its grants: every role with the pgque grant may do it again.
-- Returns 1 when the queue was confined for action.
create or replace function pgque.unconfine_queue(i_queue text, i_action text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    perform pgque._check_action(i_action);
    delete from pgque.queue_grant where qg_queue = q.queue_id and qg_action = i_action;
    update pgque.queue set queue_confined = array_remove(queue_confined, i_action)
     where queue_id = q.queue_id and i_action = any (queue_confined);
    return case when found then 1 else 0 end;
end;
$$;


-- ==== engine/functions/pgque.layer_hook.sql ====
-- Layer hooks: how upper layers plug settings and maintenance into the
-- engine (see pgque.layer_hook). The engine calls a hook by the regprocedure
-- stored in the table, which only the install writes, so no caller string
-- reaches the dynamic SQL.

-- _maint_hooks(): runs every registered 'maint' hook in name order.
-- Returns the sum of the operations they report. Not granted: maint() calls it.
create or replace function pgque._maint_hooks()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn regprocedure;
    v_n  integer := 0;
    v_r  integer;
begin
    for v_fn in select hook_fn from pgque.layer_hook where hook_kind = 'maint' order by hook_name loop
        execute format('select %s()', v_fn::regproc) into v_r;
        v_n := v_n + coalesce(v_r, 0);
    end loop;
    return v_n;
end;
$$;

-- _queue_config_hook(queue_id, param, value): applies a setting owned by an
-- upper layer. Returns false when no layer knows param.
create or replace function pgque._queue_config_hook(i_queue_id integer, i_param text, i_value text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn regprocedure;
begin
    select hook_fn into v_fn from pgque.layer_hook where hook_kind = 'queue_config' and hook_name = i_param;
    if not found then
        return false;
    end if;
    execute format('select %s($1, $2)', v_fn::regproc) using i_queue_id, i_value;
    return true;
end;
$$;

-- _rotate_hold(queue_id, table_no): why a layer keeps rotation from
-- truncating a queue's table table_no now (the first 'rotate' hook, in
-- name order, that says so), or NULL when none does. Called with the
-- table locked, so its contents cannot change under the hooks. Not
-- granted: _rotate and rotation_blockers call it.
create or replace function pgque._rotate_hold(i_queue_id integer, i_table integer)
returns text language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_fn  regprocedure;
    v_why text;
begin
    for v_fn in select hook_fn from pgque.layer_hook where hook_kind = 'rotate' order by hook_name loop
        execute format('select %s($1, $2)', v_fn::regproc) into v_why using i_queue_id, i_table;
        if v_why is not null then
            return v_why;
        end if;
    end loop;
    return null;
end;
$$;


-- ==== engine/functions/pgque.create_queue.sql ====
-- create_queue(queue): creates a queue with its event sequence, its
-- queue_ntables event tables (attached to pgque.event as partitions) and a
-- first tick, so that consumers registered now start from a position.
-- Returns 1 when created, 0 when the queue already existed.
-- Tables: queue, tick, event partitions.
create or replace function pgque.create_queue(i_queue text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id    integer;
    v_seq   text;
    v_tbl   text;
    v_n     integer;
    v_ntab  constant integer := 3;
begin
    perform pgque._check_name('queue', i_queue);
    if i_queue ~ '[#/]' then
        raise exception using errcode = 'PQ010',
            message = format('invalid queue name %L: "#" and "/" are not allowed in queue names', i_queue);
    end if;
    -- Serialize queue creation so two callers cannot race on the name.
    -- A row lock on pgque.version, not an advisory lock: any role, even one
    -- without a pgque grant, can take an advisory lock and hold it.
    perform 1 from pgque.version for update;
    if exists (select 1 from pgque.queue where queue_name = i_queue) then
        return 0;
    end if;

    v_id := nextval('pgque.queue_id_seq');
    v_seq := 'pgque.' || quote_ident('event_seq_' || v_id);
    execute format('create sequence %s', v_seq);

    for v_n in 0 .. v_ntab - 1 loop
        v_tbl := pgque._event_table(v_id, v_n);
        -- Create standalone, then attach: ATTACH takes only a SHARE UPDATE
        -- EXCLUSIVE lock on pgque.event, so producers of other queues never
        -- wait for a queue being created.
        -- The new table is empty, so ATTACH has nothing to scan and needs no
        -- CHECK to skip the scan; a CHECK would cost every INSERT
        -- (structure/tables.sql).
        execute format('create table %s (like pgque.event including defaults)', v_tbl);
        execute format('alter table pgque.event attach partition %s for values in (%s)',
                       v_tbl, v_id * 16 + v_n);
    end loop;

    insert into pgque.queue (queue_id, queue_name, queue_ntables, queue_event_seq)
    values (v_id, i_queue, v_ntab, v_seq::regclass);

    -- The sequence is new: no event id is covered, so no transaction can
    -- hold one and any transaction id bounds them (tick_xid).
    insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_xid)
    values (v_id, nextval('pgque.tick_id_seq'), clock_timestamp(), pg_current_snapshot(), 0, pg_current_xact_id());
    return 1;
end;
$$;

-- drop_queue(queue[, force]): drops a queue, its event tables, ticks,
-- retries and dead letters. Refuses while consumers are subscribed unless
-- force is true. Detaching partitions needs a short exclusive lock on
-- pgque.event; it waits at most 5 seconds for producers to get out of the way.
-- Returns 1.
create or replace function pgque.drop_queue(i_queue text, i_force boolean)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue;
    v_n   integer;
    v_sub text;
begin
    q := pgque._queue(i_queue);
    select sub_name into v_sub from pgque.subscription where sub_queue = q.queue_id limit 1;
    if found and not coalesce(i_force, false) then
        raise exception using errcode = 'PQ011',
            message = format('queue %L still has consumers (for example %L); unsubscribe them or drop with force', i_queue, v_sub);
    end if;
    perform set_config('lock_timeout', '5s', true);
    for v_n in 0 .. q.queue_ntables - 1 loop
        execute format('drop table if exists %s', pgque._event_table(q.queue_id, v_n));
    end loop;
    execute format('drop sequence if exists %s', q.queue_event_seq);
    delete from pgque.tick where tick_queue = q.queue_id;
    delete from pgque.queue where queue_id = q.queue_id;
    return 1;
end;
$$;

create or replace function pgque.drop_queue(i_queue text)
returns integer language sql security definer
set search_path = pg_catalog, pg_temp
as $$ select pgque.drop_queue(i_queue, false) $$;


-- ==== engine/functions/pgque.insert_event.sql ====
-- _insert_event(queue, type, data, extra1..4): the one place an event is
-- written. One lookup of the queue row, one INSERT into its current event
-- table; no other write, no lock beyond the insert's own. Static SQL, so
-- PL/pgSQL caches the plan. A queue confined for 'produce' also checks
-- the caller's grant. Returns the new ev_id.
-- Not granted: callers are insert_event and the api layer's send.
create or replace function pgque._insert_event(
    i_queue text, i_type text, i_data text,
    i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns bigint language plpgsql
as $$
declare
    v_part integer;
    v_seq  regclass;
    v_id   bigint;
    v_confined boolean;
begin
    select queue_id * 16 + queue_cur_table, queue_event_seq, 'produce' = any (queue_confined)
      into v_part, v_seq, v_confined
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(v_part / 16, 'produce'); -- access check
    end if;
    v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (v_id, v_part, i_type, i_data, i_extra1, i_extra2, i_extra3, i_extra4);
    return v_id;
end;
$$;

-- insert_event(queue, type, data[, extra1, extra2, extra3, extra4]): PgQ's
-- producer call. Returns the ev_id. PL/pgSQL with _insert_event's body
-- rather than a LANGUAGE sql wrapper around it: a SECURITY DEFINER SQL
-- function is never inlined and plans its statement on every call, and the
-- second PL/pgSQL layer costs as much again.
create or replace function pgque.insert_event(
    i_queue text, i_type text, i_data text,
    i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_part integer;
    v_seq  regclass;
    v_id   bigint;
    v_confined boolean;
begin
    select queue_id * 16 + queue_cur_table, queue_event_seq, 'produce' = any (queue_confined)
      into v_part, v_seq, v_confined
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(v_part / 16, 'produce'); -- access check
    end if;
    v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (v_id, v_part, i_type, i_data, i_extra1, i_extra2, i_extra3, i_extra4);
    return v_id;
end;
$$;

create or replace function pgque.insert_event(i_queue text, i_type text, i_data text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    return pgque.insert_event(i_queue, i_type, i_data, null, null, null, null);
end;
$$;


-- ==== engine/functions/pgque.ticker.sql ====
-- Ticks.
--
-- A tick records a queue position: pg_current_snapshot() and the event
-- sequence's value. A batch is the events committed between two ticks, so
-- tick snapshots of one queue must only move forward. The ticker therefore
-- locks the queue row first and takes the snapshot in a later statement
-- (a fresh READ COMMITTED snapshot, taken after any concurrent tick
-- committed), and refuses to run under REPEATABLE READ or SERIALIZABLE,
-- whose snapshot could predate the previous tick.

-- _tick_due(queue, last tick, force): whether a tick is due: the event
-- count reached ticker_max_count, or events are pending and ticker_max_lag
-- passed, or ticker_idle_period passed.
--
-- "Events are pending" is first read from the event sequence. That misses a
-- producer that took its ev_id before the last tick but committed after it
-- (the sequence did not move since): a straggler. So when the sequence is
-- still, the index is asked whether any committed event is missing from the
-- last tick's snapshot: an event at or past its xmax, or of a transaction it
-- listed as running.
--
-- That probe is most of what polling an idle queue costs (it is planned on
-- every call), so a tick that can have no straggler left is not probed
-- again. Producers take their transaction id before their event ids, and
-- tick_xid was assigned after the ticker read the sequence the tick
-- records; so a straggler's transaction id is below tick_xid. When no
-- transaction below tick_xid is running (the snapshot's xmin is at or past
-- it) and the probe, under the same or a later snapshot, finds nothing, no
-- straggler of the tick can ever commit. The session remembers that tick as
-- settled (setting pgque.settled_ticks: ",queue_id:tick_id," per queue) and
-- its later polls skip the probe. Transactions that hold no transaction id
-- (pg_dump, reports, standby feedback) do not hold a tick unsettled. The
-- memory is only a shortcut: a new session, or a tick without tick_xid,
-- probes as before, and a straggler the probe misses is still in the next
-- tick's batch, at the latest after ticker_idle_period.
create or replace function pgque._tick_due(q pgque.queue, t pgque.tick, i_force boolean)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_seq  bigint := coalesce(pg_sequence_last_value(q.queue_event_seq), 0);
    v_age  interval := clock_timestamp() - t.tick_time;
    v_mem  text;
    v_tag  text;
    v_open boolean;
begin
    if i_force or v_seq - t.tick_event_seq >= q.queue_ticker_max_count
       or v_age >= q.queue_ticker_idle_period then
        return true;
    end if;
    if v_age < q.queue_ticker_max_lag then
        return false;
    end if;
    if v_seq > t.tick_event_seq then
        return true;
    end if;
    v_mem := coalesce(nullif(current_setting('pgque.settled_ticks', true), ''), ',');
    v_tag := q.queue_id || ':' || t.tick_id || ',';
    if t.tick_xid is not null and strpos(v_mem, ',' || v_tag) > 0 then
        return false;
    end if;
    -- Before the probe: a transaction below tick_xid that ends after this
    -- snapshot may still commit a straggler.
    v_open := t.tick_xid is null or pg_snapshot_xmin(pg_current_snapshot()) < t.tick_xid;
    if exists (
        select 1 from pgque.event e
         where e.ev_part >= q.queue_id * 16 and e.ev_part < q.queue_id * 16 + 16
           and (e.ev_txid >= pg_snapshot_xmax(t.tick_snapshot)
                or e.ev_txid = any(array(select pg_snapshot_xip(t.tick_snapshot))))) then
        return true;
    end if;
    if not v_open then
        perform set_config('pgque.settled_ticks',
                           regexp_replace(v_mem, ',' || q.queue_id || ':[0-9]+,', ',') || v_tag, false);
    end if;
    return false;
end;
$$;

-- _tick_isolation(): refuses a transaction whose snapshot could predate
-- the previous tick (REPEATABLE READ, SERIALIZABLE).
create or replace function pgque._tick_isolation()
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('the ticker must run in READ COMMITTED, not %s', current_setting('transaction_isolation'));
    end if;
end;
$$;

-- _tick_poll(queue_id, force): whether a tick of the queue is due, read
-- without locking, so polling idle queues writes nothing. Returns the event
-- sequence's value read before the check when one is due, NULL otherwise.
create or replace function pgque._tick_poll(i_queue_id integer, i_force boolean)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue;
    t     pgque.tick;
    v_seq bigint;
begin
    select * into q from pgque.queue where queue_id = i_queue_id;
    v_seq := coalesce(pg_sequence_last_value(q.queue_event_seq), 0);
    select * into t from pgque.tick where tick_queue = i_queue_id order by tick_id desc limit 1;
    if pgque._tick_due(q, t, i_force) then
        return v_seq;
    end if;
    return null;
end;
$$;

-- _tick_write(queue_id, force, seq, bound): makes the tick _tick_poll
-- found due, unless a concurrent ticker made it first. seq is the event
-- sequence _tick_poll read; bound says this transaction had no id then.
-- The row lock below assigns the id, so it is above every producer's that
-- holds an event id up to seq: the tick's tick_xid, when the sequence has
-- not moved by the time the tick is written (see _tick_due). Returns the
-- new tick id or NULL. Notifies channel "pgque" with the queue's tag, so
-- consumers can wake up at once.
create or replace function pgque._tick_write(i_queue_id integer, i_force boolean, i_seq bigint, i_bound boolean)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q      pgque.queue;
    t      pgque.tick;
    v_tick bigint;
    v_seq  bigint;
begin
    select * into q from pgque.queue where queue_id = i_queue_id for no key update;
    select * into t from pgque.tick where tick_queue = i_queue_id order by tick_id desc limit 1;
    if not pgque._tick_due(q, t, i_force) then
        return null;
    end if;

    -- The tick's time is the transaction's start, as in PgQ: for the
    -- ticker daemon, the moment it polled. Polls come every tick interval
    -- (10 ms by default) and a tick is due when the last one is
    -- ticker_max_lag (10 ms) old, so a time stamped later in the call
    -- would make the next poll find it a fraction short of due, and ticks
    -- would come one poll in two.
    v_tick := nextval('pgque.tick_id_seq');
    v_seq := coalesce(pg_sequence_last_value(q.queue_event_seq), 0);
    insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_xid)
    values (i_queue_id, v_tick, now(), pg_current_snapshot(), v_seq,
            case when i_bound and v_seq = i_seq then pg_current_xact_id() end);
    -- Notifications are queued at commit, and a full NOTIFY queue (a
    -- listener idle in a transaction, perhaps a stranger's: any role may
    -- LISTEN) would then fail the tick. Consumers poll anyway, so past
    -- half full (_notify_max_usage) the wake-up is skipped rather than the
    -- tick put at risk.
    if pg_notification_queue_usage() < pgque._notify_max_usage() then
        perform pg_notify('pgque', pgque._tick_tag(q.queue_name));
    end if;
    return v_tick;
end;
$$;

-- _tick(queue_id, force): makes a tick for one queue when one is due.
-- Returns the new tick id or NULL.
create or replace function pgque._tick(i_queue_id integer, i_force boolean)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_bound boolean := pg_current_xact_id_if_assigned() is null;
    v_seq   bigint;
begin
    perform pgque._tick_isolation();
    v_seq := pgque._tick_poll(i_queue_id, i_force);
    if v_seq is null then
        return null;
    end if;
    return pgque._tick_write(i_queue_id, i_force, v_seq, v_bound);
end;
$$;

-- ticker(queue): ticks one queue if a tick is due (event count reached
-- ticker_max_count, events pending for ticker_max_lag, or
-- ticker_idle_period passed), and always after force_next_tick(queue) in
-- the same transaction. Returns the tick id or NULL.
create or replace function pgque.ticker(i_queue text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q        pgque.queue := pgque._queue(i_queue);
    v_forced boolean;
    v_tick   bigint;
begin
    v_forced := pgque._tick_forced(q.queue_id);
    v_tick := pgque._tick(q.queue_id, v_forced);
    if v_forced then
        -- One forced tick per force_next_tick.
        perform set_config('pgque.forced_ticks',
                           replace(current_setting('pgque.forced_ticks', true), ',' || q.queue_id || ',', ''), true);
    end if;
    return v_tick;
end;
$$;

-- ticker(): ticks every queue that is due. Returns how many were ticked.
create or replace function pgque.ticker()
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_bound boolean := pg_current_xact_id_if_assigned() is null;
    v_mem   text := coalesce(nullif(current_setting('pgque.settled_ticks', true), ''), ',');
    v_id    integer;
    v_seq   bigint;
    v_due   integer[] := '{}';
    v_seqs  bigint[] := '{}';
    v_n     bigint := 0;
begin
    perform pgque._tick_isolation();
    -- Every queue is polled before any is ticked: the first tick gives the
    -- transaction its id, and that id bounds the producers of every tick
    -- of this call only if all their sequences were read before it.
    --
    -- One statement first drops the queues _tick_due would certainly find
    -- not due: neither count nor idle period reached, and either the last
    -- tick younger than ticker_max_lag or the sequence still and the tick
    -- settled in this session. An idle queue then costs a row of it.
    for v_id in
        select q.queue_id
          from pgque.queue q
         cross join lateral (select coalesce(pg_sequence_last_value(q.queue_event_seq), 0) as seq) s
         cross join lateral (select t.tick_id, t.tick_time, t.tick_event_seq, t.tick_xid
                               from pgque.tick t where t.tick_queue = q.queue_id
                              order by t.tick_id desc limit 1) t
         where s.seq - t.tick_event_seq >= q.queue_ticker_max_count
            or clock_timestamp() - t.tick_time >= q.queue_ticker_idle_period
            or (clock_timestamp() - t.tick_time >= q.queue_ticker_max_lag
                and (s.seq > t.tick_event_seq or t.tick_xid is null
                     or strpos(v_mem, ',' || q.queue_id || ':' || t.tick_id || ',') = 0))
         order by q.queue_id
    loop
        v_seq := pgque._tick_poll(v_id, false);
        if v_seq is not null then
            v_due := v_due || v_id;
            v_seqs := v_seqs || v_seq;
        end if;
    end loop;
    for i in 1 .. cardinality(v_due) loop
        if pgque._tick_write(v_due[i], false, v_seqs[i], v_bound) is not null then
            v_n := v_n + 1;
        end if;
    end loop;
    return v_n;
end;
$$;

-- force_next_tick(queue): makes the next ticker call tick, as in PgQ, by
-- advancing the event sequence by ticker_max_count. A ticker daemon may
-- tick at the same moment and use that advance up, so the transaction also
-- remembers the queue (a transaction-local setting read by
-- _tick_forced): ticker(queue) later in the same transaction always
-- ticks. Returns the new sequence value.
create or replace function pgque.force_next_tick(i_queue text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    perform set_config('pgque.forced_ticks',
                       coalesce(nullif(current_setting('pgque.forced_ticks', true), ''), '') || ',' || q.queue_id || ',', true);
    return setval(q.queue_event_seq,
                  coalesce(pg_sequence_last_value(q.queue_event_seq), 0) + q.queue_ticker_max_count);
end;
$$;

-- _tick_tag(queue): the payload of a queue's tick notification on
-- channel pgque: 16 hex digits of sha256('tick:' || queue). Any role of
-- the cluster may LISTEN, so the payload does not spell the queue's name;
-- clients compute the same tag from the name they consume (Go:
-- workerpool.TickTag). A listener that guesses a name can confirm it: the
-- tag keeps names out of plain sight, it does not make them secret.
-- Touches no table. Inlined into the ticker's statement (no SET clause,
-- every name qualified; stable, as convert_to is).
create or replace function pgque._tick_tag(i_queue text)
returns text language sql stable
as $$
    select pg_catalog.encode(substring(pg_catalog.sha256(pg_catalog.convert_to('tick:' operator(pg_catalog.||) i_queue, 'UTF8'))
                                       from 1 for 8), 'hex')
$$;

-- _notify_max_usage(): the NOTIFY queue usage (0..1) from which ticks
-- skip their wake-up notification: 0.5, or less when the ticking session
-- sets pgque.notify_max_usage to a number between 0 and 0.5. The setting
-- can only make the skip start earlier (a session that lowers it only
-- makes its own ticks quieter); anything else is ignored. The queue is 8 GB
-- in a standard build, so tests lower it to exercise the skip without
-- filling gigabytes. Touches no table.
create or replace function pgque._notify_max_usage()
returns double precision language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_set text := current_setting('pgque.notify_max_usage', true);
    v_max double precision;
begin
    if v_set is null or v_set = '' then
        return 0.5;
    end if;
    begin
        v_max := v_set::double precision;
    exception when others then
        return 0.5;
    end;
    if v_max is null or not (v_max >= 0 and v_max <= 0.5) then
        return 0.5;
    end if;
    return v_max;
end;
$$;

-- _tick_forced(queue_id): whether force_next_tick(queue) ran earlier in
-- this transaction. The setting is only a hint for the admin's own
-- transaction: setting it by hand forces ticks, which force_next_tick
-- allows anyway, and only ticker(queue) (pgque_admin) reads it.
create or replace function pgque._tick_forced(i_queue_id integer)
returns boolean language sql stable
as $$
    select pg_catalog.strpos(coalesce(pg_catalog.current_setting('pgque.forced_ticks', true), ''),
                             ',' operator(pg_catalog.||) i_queue_id::pg_catalog.text operator(pg_catalog.||) ',')
           operator(pg_catalog.>) 0
$$;

-- _ticker_expiry(lease): when the ticker lease expires: the later of
-- the claim's expiry and the last renewal's (ticker_beat_seq, see
-- structure/tables.sql). Meaningless once the owner is NULL (free).
create or replace function pgque._ticker_expiry(l pgque.ticker_lease)
returns timestamptz language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select greatest(l.lease_until,
                    to_timestamp(pg_sequence_last_value('pgque.ticker_beat_seq'::regclass)::double precision / 1000))
$$;

-- ticker_lead(worker, ttl): leader election for ticker daemons. Returns
-- true when worker holds the single ticker lease (renewing it when less than
-- half of ttl is left, taking it over when free or expired). worker is 1 to
-- 200 bytes; ttl is 1 ms to 1 day of real time (PQ011). A renewal writes no
-- row version: it locks the row (which marks the tuple in place, and makes
-- a concurrent takeover wait and then see the renewal) and moves
-- ticker_beat_seq. Only a change of owner updates the row.
-- Tables: ticker_lease (lock; insert or update on a change of owner).
create or replace function pgque.ticker_lead(i_worker text, i_ttl interval)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l   pgque.ticker_lease;
    v_now timestamptz := clock_timestamp();
    v_ttl interval;
begin
    if i_worker is null or i_worker = '' or octet_length(i_worker) > 200 then
        raise exception using errcode = 'PQ011',
            message = format('ticker worker id must be 1 to 200 bytes, not %s', coalesce(octet_length(i_worker)::text, 'NULL'));
    end if;
    if i_ttl is null then
        raise exception using errcode = 'PQ011', message = 'ticker lease ttl must not be NULL';
    end if;
    -- Bounded on the real duration, so a lease cannot be taken for years
    -- with an interval that only compares as short.
    v_ttl := pgque._check_interval('ticker lease ttl', i_ttl, interval '1 millisecond', interval '1 day');
    -- The common case, a leader well within its lease, only reads.
    select * into l from pgque.ticker_lease;
    if found and l.owner = i_worker and pgque._ticker_expiry(l) - v_now > v_ttl / 2 then
        return true;
    end if;
    select * into l from pgque.ticker_lease for update;
    if found and l.owner = i_worker then
        -- A renewal (also of a lease that ran out while nobody took it).
        if coalesce(pgque._ticker_expiry(l) - v_now <= v_ttl / 2, true) then
            perform setval('pgque.ticker_beat_seq', (extract(epoch from v_now + v_ttl) * 1000)::bigint);
        end if;
        return true;
    end if;
    insert into pgque.ticker_lease as tl (singleton, owner, lease_until, epoch)
    values (true, i_worker, v_now + v_ttl, 1)
    on conflict (singleton) do update
       set owner = excluded.owner,
           lease_until = excluded.lease_until,
           epoch = tl.epoch + case when tl.owner is not distinct from excluded.owner then 0 else 1 end
     where tl.owner is null
        or greatest(tl.lease_until,
                    to_timestamp(pg_sequence_last_value('pgque.ticker_beat_seq'::regclass)::double precision / 1000)) < v_now;
    return found;
end;
$$;

-- ticker_resign(worker): gives the ticker lease up if worker holds it, and
-- then notifies channel pgque_ticker (delivered at commit) so that standing
-- tickers seek the lease at once instead of at their next lease check.
create or replace function pgque.ticker_resign(i_worker text)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    update pgque.ticker_lease set owner = null, lease_until = null where owner = i_worker;
    if found then
        perform pg_catalog.pg_notify('pgque_ticker', 'resigned');
    end if;
    return found;
end;
$$;


-- ==== engine/functions/pgque.register_consumer.sql ====
-- register_consumer(queue, consumer): subscribes consumer to queue. The new
-- subscription starts at the queue's latest tick: it receives the events
-- committed after that tick. Returns 1 when new, 0 when it existed.
-- Raises PQ050 when no subscription id is free.
-- Tables: subscription, sub_state (insert).
create or replace function pgque.register_consumer(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q      pgque.queue := pgque._queue(i_queue);
    v_tick bigint;
    v_id   integer;
    v_try  integer;
begin
    perform pgque._check_name('consumer', i_consumer);
    if exists (select 1 from pgque.subscription where sub_queue = q.queue_id and sub_name = i_consumer) then
        return 0;
    end if;
    -- Until this transaction ends, the key-share lock on the queue row keeps
    -- _tick_flip from dropping the starting tick (it cannot see this
    -- subscription before the commit).
    perform 1 from pgque.queue where queue_id = q.queue_id for key share;
    select tick_id into v_tick from pgque.tick where tick_queue = q.queue_id order by tick_id desc limit 1;
    -- Ids come from a cycling sequence: nextval takes no lock (a reader's
    -- open transaction blocks nobody) and ids burnt by rolled-back
    -- subscribes come round again instead of running out. After the wrap
    -- an id may still be in use: the insert then does nothing and the next
    -- id is tried. Reusing an id is safe: batch ids never repeat, and every
    -- row keyed by a subscription id goes with its subscription.
    for v_try in 1 .. 1000 loop
        v_id := nextval('pgque.subscription_id_seq');
        insert into pgque.subscription (sub_id, sub_queue, sub_name, sub_last_tick)
        values (v_id, q.queue_id, i_consumer, v_tick)
        on conflict do nothing;
        if found then
            -- A reused id's old records are superseded by this newer one.
            perform pgque._put_state(row(v_id, null, null, v_tick, null, null, null, null, false, null, null)::pgque.sub_state);
            return 1;
        end if;
        if exists (select 1 from pgque.subscription where sub_queue = q.queue_id and sub_name = i_consumer) then
            return 0;
        end if;
    end loop;
    raise exception using errcode = 'PQ050',
        message = 'no free subscription id: 1000 ids in a row are in use (the limit is 1048575 subscriptions)';
end;
$$;

-- unregister_consumer(queue, consumer): removes the subscription, its open
-- batch and its pending retries. Raises PQ002 when it does not exist.
-- Returns 1.
create or replace function pgque.unregister_consumer(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._subscription(i_queue, i_consumer);
begin
    delete from pgque.subscription where sub_id = s.sub_id;
    return 1;
end;
$$;


-- ==== engine/functions/pgque.next_batch.sql ====
-- Batches.
--
-- A batch is the events committed between two ticks of its queue: visible in
-- the last tick's snapshot and not in the first's. next_batch opens the batch
-- from a subscription's cursor (its last tick) to a later tick; finish_batch
-- moves the cursor to that later tick. Both append a sub_state record and
-- update nothing. A batch id is nextval(batch_id_seq) * 2^20 + sub_id: the
-- subscription is found from the id alone.

-- _batch_end(queue_id, last_tick, span, until): the last tick of a new
-- batch starting at last_tick, or NULL when no later tick exists up to
-- until (NULL: no bound). With span NULL it is the next tick (as PgQ's
-- next_batch). Otherwise a consumer that is behind takes several ticks at
-- once: the furthest tick (of the next 1000) whose recorded event sequence
-- is at most span past last_tick's, and at least the next tick, so a
-- backlog of small ticks is consumed in batches of about span events. A
-- sealed subscription passes its seal tick as until (an online resize of
-- slots seals the old ones): no batch of it ends past the seal.
-- Tables: tick (read).
drop function if exists pgque._batch_end(integer, bigint, bigint);
create or replace function pgque._batch_end(i_queue integer, i_last_tick bigint, i_span bigint, i_until bigint)
returns bigint language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_next bigint;
    v_far  bigint;
begin
    -- One statement (every receive that opens a batch runs it): the next
    -- 1001 ticks once, the next of them, and the furthest within span.
    with c as (
        select tick_id, tick_event_seq from pgque.tick
         where tick_queue = i_queue and tick_id > i_last_tick
           and tick_id <= coalesce(i_until, 9223372036854775807)
         order by tick_id limit 1001)
    select (select min(c.tick_id) from c),
           case when i_span is not null then
               (select max(c.tick_id) from c
                 where c.tick_event_seq <= (select t.tick_event_seq from pgque.tick t
                                             where t.tick_queue = i_queue and t.tick_id = i_last_tick limit 1) + i_span)
           end
      into v_next, v_far;
    return coalesce(v_far, v_next);
end;
$$;

-- _open_batch(sub_id, queue_id, span): the open batch of the subscription,
-- or a new one if a later tick exists, or a NULL record. Takes the
-- subscription's lock (the receive lock): concurrent callers serialise and
-- get the same batch. A new batch ends where _batch_end(span) says: at the
-- next tick with span NULL (as PgQ's next_batch), further on for a
-- consumer that is behind. A sealed subscription (sub_until_tick set)
-- never opens a batch past its seal tick: it ends there, and whatever comes
-- later is another subscription's (an online resize of slots seals the old
-- ones). Polls that find nothing write nothing.
-- Returns the state record (st_batch, st_last_tick, st_next_tick, progress).
create or replace function pgque._open_batch(i_sub integer, i_queue integer, i_span bigint)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st      pgque.sub_state := pgque._sub_state(i_sub);
    v_next  bigint;
    v_until bigint := coalesce((select sub_until_tick from pgque.subscription where sub_id = i_sub),
                               9223372036854775807);
begin
    if st.st_batch is null and not exists (
        select 1 from pgque.tick where tick_queue = i_queue and tick_id > st.st_last_tick
                                   and tick_id <= v_until) then
        return null;
    end if;
    st := pgque._lock_sub(i_sub);
    if st.st_batch is not null then
        return st;
    end if;
    -- Read again under the lock: a seal committed while this call waited
    -- for it must bound the batch.
    v_until := (select sub_until_tick from pgque.subscription where sub_id = i_sub);
    v_next := pgque._batch_end(i_queue, st.st_last_tick, i_span, v_until);
    if v_next is null then
        return null;
    end if;
    st.st_next_tick := v_next;
    st.st_batch := nextval('pgque.batch_id_seq') * 1048576 + i_sub;
    st.st_acked_to := null;
    st.st_delivered_to := null;
    st.st_delivered_all := false;
    return pgque._put_state(st);
end;
$$;

-- next_batch(queue, consumer): the open batch of the subscription, or a new
-- one ending at the next tick if one exists, or NULL (PgQ's next_batch).
-- Tables: sub_state (insert when a batch is opened), subscription (lock).
create or replace function pgque.next_batch(i_queue text, i_consumer text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._subscription(i_queue, i_consumer);
begin
    return (pgque._open_batch(s.sub_id, s.sub_queue, null)).st_batch;
end;
$$;

-- _batch(batch_id): the open batch's subscription row (with its current
-- state), or PQ020.
create or replace function pgque._batch(i_batch_id bigint)
returns pgque.subscription language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    select * into s from pgque.subscription where sub_id = (i_batch_id % 1048576)::integer;
    s := pgque._with_state(s);
    if s.sub_batch is distinct from i_batch_id then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    return s;
end;
$$;

-- _finish(state): closes the state's open batch and moves the cursor to its
-- last tick (the caller holds _lock_sub).
create or replace function pgque._finish(st pgque.sub_state)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    st.st_last_tick := st.st_next_tick;
    st.st_next_tick := null;
    st.st_batch := null;
    st.st_acked_to := null;
    st.st_delivered_to := null;
    st.st_delivered_all := false;
    perform pgque._put_state(st);
end;
$$;

-- finish_batch(batch_id): closes the batch and advances the cursor.
-- Returns 1; raises PQ020 when the batch is not open.
-- Tables: sub_state (insert), subscription (lock).
create or replace function pgque.finish_batch(i_batch_id bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    st := pgque._lock_sub((i_batch_id % 1048576)::integer);
    if st.st_batch is distinct from i_batch_id then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    perform pgque._finish(st);
    return 1;
end;
$$;


-- ==== engine/functions/pgque.get_batch_events.sql ====
-- Reading a batch.
--
-- The events of a batch are those whose ev_txid is visible in the batch's
-- tick snapshot and not visible in the previous tick's snapshot: exactly
-- the transactions that committed between the two ticks, however long they
-- ran and whichever event table they wrote to. "Not visible in the previous
-- snapshot" is spelled as an index-friendly condition: the txid is at or
-- past the previous snapshot's xmax, or in its list of in-progress txids.
-- All of the queue's event tables are searched (an index probe each), so a
-- long transaction that wrote to a table since rotated out of "current" is
-- still found. Retried events carry ev_owner and are seen only by their
-- subscription.

-- _batch_query(extra_where): the batch query text. Parameters: $1, $2 the
-- queue's ev_part range, $3 previous xmax, $4 batch xmax, $5 previous
-- in-progress txids, $6 batch snapshot, $7 sub_id, $8 one ev_id or NULL.
-- extra_where is a trusted predicate (see get_batch_cursor).
create or replace function pgque._batch_query(i_extra_where text)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$
select 'select ev_id, ev_time, ev_txid::text::bigint, ev_retry, ev_type, ev_data,'
    || ' ev_extra1, ev_extra2, ev_extra3, ev_extra4'
    || ' from pgque.event'
    || ' where ev_part >= $1 and ev_part < $2'
    || ' and ((ev_txid >= $3 and ev_txid < $4) or ev_txid = any($5))'
    || ' and pg_catalog.pg_visible_in_snapshot(ev_txid, $6)'
    || ' and (ev_owner is null or ev_owner = $7)'
    || ' and ($8::bigint is null or ev_id = $8)'
    || coalesce(' and (' || i_extra_where || ')', '')
    || ' order by ev_id'
$$;

-- _batch_bounds(sub): the parameters $1..$7 of _batch_query for the open
-- batch of a subscription.
create or replace function pgque._batch_bounds(
    s pgque.subscription,
    out o_part_lo integer, out o_part_hi integer,
    out o_prev_xmax xid8, out o_cur_xmax xid8, out o_prev_xip xid8[],
    out o_cur_snap pg_snapshot)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_prev pg_snapshot;
begin
    select tick_snapshot into v_prev from pgque.tick
     where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    select tick_snapshot into o_cur_snap from pgque.tick
     where tick_queue = s.sub_queue and tick_id = s.sub_next_tick;
    if v_prev is null or o_cur_snap is null then
        raise exception using errcode = 'XX000',
            message = format('ticks %s/%s of batch %s are missing', s.sub_last_tick, s.sub_next_tick, s.sub_batch);
    end if;
    o_part_lo := s.sub_queue * 16;
    o_part_hi := s.sub_queue * 16 + 16;
    o_prev_xmax := pg_snapshot_xmax(v_prev);
    o_cur_xmax := pg_snapshot_xmax(o_cur_snap);
    -- With 0 (no transaction's id) so that the list is never empty: see
    -- v_xip in pgque.deliver_raw.sql.
    o_prev_xip := array(select pg_snapshot_xip(v_prev)) || '0'::xid8;
end;
$$;

-- _batch_event(sub, ev_id): the one event ev_id of the subscription's open
-- batch, as get_batch_events returns it; PQ022 when it is not in the batch.
-- Used by event_retry and event_defer.
create or replace function pgque._batch_event(s pgque.subscription, i_ev_id bigint)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    b record := pgque._batch_bounds(s);
begin
    return query execute pgque._batch_query(null)
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, i_ev_id;
    if not found then
        raise exception using errcode = 'PQ022', message = format('event %s is not in batch %s', i_ev_id, s.sub_batch);
    end if;
end;
$$;

-- _batch_rows(sub, where, limit): the first `limit` events of the
-- subscription's open batch (s carries its current state) matching the
-- trusted predicate i_where, in ev_id order: get_batch_cursor without the
-- batch lookup and the cursor, for callers that already hold the state.
create or replace function pgque._batch_rows(s pgque.subscription, i_where text, i_limit integer)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    b record := pgque._batch_bounds(s);
begin
    return query execute pgque._batch_query(i_where) || ' limit ' || i_limit::text
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, null::bigint;
end;
$$;

-- get_batch_events(batch_id): the batch's events in ev_id order.
create or replace function pgque.get_batch_events(i_batch_id bigint)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._batch(i_batch_id);
    b record;
begin
    b := pgque._batch_bounds(s);
    return query execute pgque._batch_query(null)
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, null::bigint;
end;
$$;

-- get_batch_cursor(batch_id, cursor_name, fetch, extra_where): opens cursor
-- cursor_name over the batch's events, filtered by extra_where, and returns
-- its first `fetch` rows; the cursor stays open in the transaction for
-- further FETCH. extra_where is pasted into the query as SQL: this function
-- is a SQL sink, executable by the owner and pgque_admin only. App roles
-- reach it through the partition layer, which builds the predicate from
-- validated integers alone.
create or replace function pgque.get_batch_cursor(
    i_batch_id bigint, i_cursor_name text, i_fetch integer, i_extra_where text)
returns table (ev_id bigint, ev_time timestamptz, ev_txid bigint, ev_retry integer, ev_type text,
               ev_data text, ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s   pgque.subscription := pgque._batch(i_batch_id);
    b   record;
    c   refcursor := i_cursor_name;
begin
    if i_cursor_name is null or i_fetch is null then
        raise exception using errcode = '22004', message = 'cursor name and fetch count must not be NULL';
    end if;
    if i_fetch < 0 then
        raise exception using errcode = 'PQ011', message = format('fetch count must not be negative, not %s', i_fetch);
    end if;
    b := pgque._batch_bounds(s);
    open c no scroll for execute pgque._batch_query(nullif(i_extra_where, ''))
        using b.o_part_lo, b.o_part_hi, b.o_prev_xmax, b.o_cur_xmax, b.o_prev_xip, b.o_cur_snap,
              s.sub_id, null::bigint;
    -- One FETCH for the whole first part, not a PL/pgSQL loop per row
    -- (FETCH FORWARD 0 would mean "the current row": skip it).
    if i_fetch > 0 then
        return query execute format('fetch forward %s from %I', i_fetch, i_cursor_name);
    end if;
end;
$$;


-- ==== engine/functions/pgque.event_retry.sql ====
-- Retries.
--
-- event_retry copies one event of an open batch to retry_queue, owned by the
-- batch's subscription, with ev_retry + 1; maint_retry_events puts due
-- copies back into the queue's current event table (same ev_id and extra
-- fields, a new ev_txid), where only that subscription sees them. An event
-- that already had max_retries retries goes to dead_letter instead.
-- A second retry of the same event while a copy is pending is a no-op.

-- _event_retry(batch_id, ev_id, retry_after, reason): returns 1 when the
-- event was scheduled for retry, 0 when it was dead-lettered. retry_after
-- must be 0 to 30 days (PQ011); a NULL retry_after dead-letters the event at
-- once, whatever its retry count: a consumer's way to say that retrying
-- cannot help (nack and nack_partitioned pass it through). The reason is
-- cut to 1000 characters.
create or replace function pgque._event_retry(
    i_batch_id bigint, i_ev_id bigint, i_retry_after interval, i_reason text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    s   pgque.subscription := pgque._batch(i_batch_id);
    e   record;
    q   pgque.queue;
    v_after  interval;
    v_reason text;
begin
    if i_ev_id is null then
        raise exception using errcode = '22004', message = 'event id must not be NULL';
    end if;
    -- Bounded on the real duration (months are not 30 days), and the
    -- reason on its length, so a nack can neither park an event for
    -- centuries nor store an unbounded text.
    if i_retry_after is not null then
        v_after := pgque._check_interval('retry delay', i_retry_after, interval '0', interval '30 days');
    end if;
    v_reason := left(i_reason, 1000);
    select * into e from pgque._batch_event(s, i_ev_id);
    select * into q from pgque.queue where queue_id = s.sub_queue;

    if i_retry_after is null or coalesce(e.ev_retry, 0) >= q.queue_max_retries then
        insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_txid, ev_retry,
                                       ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        values (s.sub_queue, s.sub_name, v_reason, e.ev_id, e.ev_time, e.ev_txid::text::xid8, coalesce(e.ev_retry, 0),
                e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4);
        return 0;
    end if;
    insert into pgque.retry_queue (ev_owner, ev_id, ev_queue, ev_retry_after, ev_time, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (s.sub_id, e.ev_id, s.sub_queue, clock_timestamp() + v_after, e.ev_time,
            coalesce(e.ev_retry, 0) + 1, e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4)
    on conflict (ev_owner, ev_id) do nothing;
    return 1;
end;
$$;

-- event_retry(batch_id, ev_id, retry_seconds): PgQ's retry call.
-- Returns 1 when scheduled for retry, 0 when dead-lettered.
create or replace function pgque.event_retry(i_batch_id bigint, i_ev_id bigint, i_retry_seconds integer)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_retry_seconds is null then
        raise exception using errcode = '22004', message = 'retry seconds must not be NULL';
    end if;
    return pgque._event_retry(i_batch_id, i_ev_id, make_interval(secs => i_retry_seconds), null);
end;
$$;

-- maint_retry_events(): moves every due retry back into its queue's current
-- event table, in one statement (nothing due is left behind), then advances
-- each affected queue's event sequence by one so the ticker sees pending
-- work and ticks within ticker_max_lag. Returns the number of events moved.
create or replace function pgque.maint_retry_events()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_n      integer;
    v_queues integer[];
begin
    with due as (
        delete from pgque.retry_queue r
         where r.ev_retry_after <= clock_timestamp()
        returning r.*
    ), moved as (
        insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                                 ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        select d.ev_id, d.ev_time, q.queue_id * 16 + q.queue_cur_table, d.ev_owner, d.ev_retry,
               d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
          from due d join pgque.queue q on q.queue_id = d.ev_queue
        returning ev_part
    )
    select count(*), array_agg(distinct m.ev_part / 16) into v_n, v_queues from moved m;
    perform nextval(q.queue_event_seq) from pgque.queue q where q.queue_id = any(v_queues);
    return v_n;
end;
$$;


-- ==== engine/functions/pgque.event_defer.sql ====
-- Deferral: set events aside without counting a retry.
--
-- event_retry is for an event that failed: it counts toward max_retries.
-- Deferral is for an event that must wait for another one: it is copied to
-- pgque.deferred under a caller-chosen group, untouched (ev_retry as it was),
-- and event_undefer later moves the whole group back into the queue's
-- current event table, owned by the subscription, where it is delivered in
-- ev_id order in the next batch. Deferring the same event twice is a no-op.

-- _defer_row(sub_id, group, event fields): defers one event whose fields
-- the caller already has. Returns 1 when deferred, 0 when it already was.
create or replace function pgque._defer_row(
    i_sub integer, i_group text, i_ev_id bigint, i_ev_time timestamptz, i_ev_retry integer,
    i_type text, i_data text, i_extra1 text, i_extra2 text, i_extra3 text, i_extra4 text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    insert into pgque.deferred (ev_owner, ev_id, ev_group, ev_queue, ev_time, ev_retry,
                                ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    select i_sub, i_ev_id, i_group, s.sub_queue, i_ev_time, i_ev_retry,
           i_type, i_data, i_extra1, i_extra2, i_extra3, i_extra4
      from pgque.subscription s where s.sub_id = i_sub
    on conflict (ev_owner, ev_id) do nothing;
    return case when found then 1 else 0 end;
end;
$$;

-- event_defer(batch_id, ev_id, group): defers one event of an open batch
-- under group. Returns 1 when deferred, 0 when it already was; PQ022 when
-- the event is not in the batch.
create or replace function pgque.event_defer(i_batch_id bigint, i_ev_id bigint, i_group text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._batch(i_batch_id);
    e record;
begin
    if i_ev_id is null or i_group is null then
        raise exception using errcode = '22004', message = 'event id and group must not be NULL';
    end if;
    select * into e from pgque._batch_event(s, i_ev_id);
    return pgque._defer_row(s.sub_id, i_group, e.ev_id, e.ev_time, e.ev_retry, e.ev_type, e.ev_data,
                            e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4);
end;
$$;

-- _undefer(sub_id, group): moves a deferred group back into the log, owned
-- by the subscription. Returns how many events and the highest ev_id.
create or replace function pgque._undefer(i_sub integer, i_group text,
                                          out o_count integer, out o_max_id bigint)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    with moved as (
        delete from pgque.deferred d
         where d.ev_owner = i_sub and d.ev_group = i_group
        returning d.*
    ), ins as (
        insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                                 ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        select m.ev_id, m.ev_time, q.queue_id * 16 + q.queue_cur_table, m.ev_owner, m.ev_retry,
               m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4
          from moved m join pgque.queue q on q.queue_id = m.ev_queue
        returning ev_id, ev_part
    )
    select count(*), max(ins.ev_id) into o_count, o_max_id from ins;
    if o_count > 0 then
        -- Let the ticker see pending work, as maint_retry_events does.
        perform nextval(q.queue_event_seq)
           from pgque.queue q join pgque.subscription s on s.sub_queue = q.queue_id
          where s.sub_id = i_sub;
    end if;
end;
$$;

-- event_undefer(queue, consumer, group): re-delivers a deferred group to the
-- consumer, in ev_id order, in a coming batch. Returns how many events.
create or replace function pgque.event_undefer(i_queue text, i_consumer text, i_group text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s pgque.subscription := pgque._subscription(i_queue, i_consumer);
begin
    if i_group is null then
        raise exception using errcode = '22004', message = 'group must not be NULL';
    end if;
    return (pgque._undefer(s.sub_id, i_group)).o_count;
end;
$$;


-- ==== engine/functions/pgque.dead_letter.sql ====
-- Dead letters: events that failed more than max_retries times, kept with
-- the consumer they failed for and the last failure's reason.

-- dlq_list(queue, consumer, max): the oldest dead letters of a queue (of
-- one consumer when given), at most max rows.
create or replace function pgque.dlq_list(i_queue text, i_consumer text default null, i_max integer default 100)
returns table (dl_id bigint, consumer text, dl_time timestamptz, reason text, ev_id bigint,
               ev_time timestamptz, ev_retry integer, ev_type text, ev_data text,
               ev_extra1 text, ev_extra2 text, ev_extra3 text, ev_extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    if i_max is null or i_max < 0 then
        raise exception using errcode = 'PQ011', message = format('max must be zero or more, not %s', coalesce(i_max::text, 'NULL'));
    end if;
    return query
        select d.dl_id, d.dl_consumer, d.dl_time, d.dl_reason, d.ev_id, d.ev_time, d.ev_retry,
               d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4
          from pgque.dead_letter d
         where d.dl_queue = q.queue_id and (i_consumer is null or d.dl_consumer = i_consumer)
         order by d.dl_id
         limit i_max;
end;
$$;

-- dlq_replay(queue, dl_id): puts a dead letter back into the queue for the
-- consumer it failed for (same ev_id and extra fields, retry count reset to
-- 0, seen only by that consumer), and removes it from the dead-letter table.
-- Raises PQ040 when there is no such dead letter, PQ002 when its consumer
-- is gone. Returns the ev_id.
create or replace function pgque.dlq_replay(i_queue text, i_dl_id bigint)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    d pgque.dead_letter;
    s pgque.subscription;
begin
    delete from pgque.dead_letter where dl_queue = q.queue_id and dl_id = i_dl_id returning * into d;
    if not found then
        raise exception using errcode = 'PQ040',
            message = format('dead letter %s does not exist in queue %L', coalesce(i_dl_id::text, 'NULL'), i_queue);
    end if;
    s := pgque._subscription(i_queue, d.dl_consumer);
    insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                             ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (d.ev_id, d.ev_time, q.queue_id * 16 + q.queue_cur_table, s.sub_id, 0, d.ev_type, d.ev_data,
            d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4);
    perform nextval(q.queue_event_seq);
    return d.ev_id;
end;
$$;

-- dlq_purge(queue, consumer, older_than): deletes dead letters of a queue
-- (of one consumer when given) older than older_than. Returns how many.
create or replace function pgque.dlq_purge(i_queue text, i_consumer text default null,
                                           i_older_than interval default '0')
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q   pgque.queue := pgque._queue(i_queue);
    v_n bigint;
begin
    if i_older_than is null or i_older_than < interval '0' then
        raise exception using errcode = 'PQ011',
            message = format('older_than must be zero or more, not %s', coalesce(i_older_than::text, 'NULL'));
    end if;
    delete from pgque.dead_letter
     where dl_queue = q.queue_id and (i_consumer is null or dl_consumer = i_consumer)
       and dl_time <= clock_timestamp() - i_older_than;
    get diagnostics v_n = row_count;
    return v_n;
end;
$$;


-- ==== engine/functions/pgque.maint.sql ====
-- Maintenance: table rotation, and flips of the tick and state tables.
--
-- Rotation, in two steps. Step 1 waits until rotation_period has passed and
-- until the table that is to become current (the oldest) no longer holds an
-- event some subscription still needs; it then TRUNCATEs that table. Step 2,
-- in the same transaction, makes it the current table. The safety check is
-- done under an ACCESS EXCLUSIVE lock on that table: the lock waits for any
-- transaction still writing into it (a long producer from an earlier
-- rotation), and once it is held every row in the table is committed or
-- dead, so "no subscription's cursor is behind a row of this table" is a
-- plain, complete check. Rows below the oldest cursor's xmin are visible
-- to every cursor, so the check reads only the index range above it.
-- Space is only ever reclaimed by TRUNCATE; no event row is deleted. A
-- layer's 'rotate' hook can hold a table a while longer (_rotate_hold).

-- _rotate(queue_id): rotates a queue's tables when due and safe.
-- Returns 1 when rotated, 0 otherwise.
create or replace function pgque._rotate(i_queue_id integer)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q        pgque.queue;
    v_next   integer;
    v_tbl    text;
    v_xmin   xid8;
    v_pinned boolean;
    v_old_lt text := current_setting('lock_timeout');
begin
    select * into q from pgque.queue where queue_id = i_queue_id for no key update;
    if clock_timestamp() - q.queue_switch_time < q.queue_rotation_period then
        return 0;
    end if;
    -- A subscription being registered is invisible to the check below, yet
    -- the events committed after its starting tick are its to receive. It
    -- holds a key-share lock on the queue row until it commits: rotate later.
    perform 1 from pgque.queue where queue_id = i_queue_id for update skip locked;
    if not found then
        return 0;
    end if;
    v_next := (q.queue_cur_table + 1) % q.queue_ntables;
    v_tbl := pgque._event_table(q.queue_id, v_next);

    -- Readers hold their locks only for a short transaction; wait a little,
    -- and try again at the next maint() if a writer is still in there.
    begin
        perform set_config('lock_timeout', '500ms', true);
        execute format('lock table %s in access exclusive mode', v_tbl);
        perform set_config('lock_timeout', v_old_lt, true);
    exception when lock_not_available then
        perform set_config('lock_timeout', v_old_lt, true);
        return 0;
    end;

    select min(pg_snapshot_xmin(t.tick_snapshot)) into v_xmin
      from pgque.subscription s
      cross join lateral pgque._sub_state(s.sub_id) st
      join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = st.st_last_tick
     where s.sub_queue = q.queue_id;
    if v_xmin is not null then
        execute format(
            'select exists (select 1 from %s e
                             join pgque.subscription s on s.sub_queue = $1
                                  and (e.ev_owner is null or e.ev_owner = s.sub_id)
                             cross join lateral pgque._sub_state(s.sub_id) st
                             join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = st.st_last_tick
                            where e.ev_txid >= $2
                              and not pg_catalog.pg_visible_in_snapshot(e.ev_txid, t.tick_snapshot))', v_tbl)
           into v_pinned using q.queue_id, v_xmin;
        if v_pinned then
            return 0;
        end if;
    end if;

    -- A layer may still need the table's rows (dedup keys within their
    -- window): rotate later.
    if pgque._rotate_hold(q.queue_id, v_next) is not null then
        return 0;
    end if;

    -- Step 1: reclaim the oldest table. Step 2: make it current, and note
    -- when the table it replaces stopped being written.
    execute format('truncate %s', v_tbl);
    update pgque.queue set queue_cur_table = v_next, queue_switch_time = clock_timestamp(),
                           queue_retired[q.queue_cur_table + 1] = clock_timestamp(),
                           queue_retired[v_next + 1] = null
     where queue_id = q.queue_id;
    return 1;
end;
$$;

-- Flips of the append-only state (see structure/state.sql). A flip of a
-- family (ticks or sub_state) takes an ACCESS EXCLUSIVE lock on its current
-- partition, then makes the other generation current: the lock waits for
-- every transaction still reading or writing the retired partition, and
-- once it is held every row in it is committed, so copying what is still
-- needed into the other partition (with a statement snapshot taken after
-- the lock) and truncating the retired one loses nothing. Writers that
-- picked the old generation before the switch wait for the lock and then
-- insert into the retired partition after the TRUNCATE: their rows are
-- kept there until the next flip. A flip waits at most 200 ms for the lock
-- and is retried at the next maint() otherwise; it is skipped (without
-- locking) when the current partition holds nothing but needed rows, so an
-- idle system costs a few index probes.

-- _flip_lock(table): locks a retired partition, waiting at most 200 ms.
-- Returns false when the lock was not granted.
create or replace function pgque._flip_lock(i_table text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_old_lt text := current_setting('lock_timeout');
begin
    perform set_config('lock_timeout', '200ms', true);
    execute format('lock table %s in access exclusive mode', i_table);
    perform set_config('lock_timeout', v_old_lt, true);
    return true;
exception when lock_not_available then
    perform set_config('lock_timeout', v_old_lt, true);
    return false;
end;
$$;

-- _state_keep(gen): the newest record of every existing subscription, when
-- it lives in partition gen.
create or replace function pgque._state_keep(i_gen integer)
returns setof pgque.sub_state language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select st.*
      from pgque.subscription s
      cross join lateral (select * from pgque.sub_state x where x.st_sub = s.sub_id
                           order by x.st_seq desc limit 1) st
     where st.st_gen = i_gen
$$;

-- _state_flip(): retires the current sub_state partition, keeping the
-- newest record of every existing subscription. Returns 1 when flipped.
-- Tables: rotation (lock), sub_state (insert, truncate).
create or replace function pgque._state_flip()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur integer;
begin
    perform 1 from pgque.rotation where rot_name = 'state' for update;
    v_cur := pgque._gen('state');
    if (select count(*) from pgque.sub_state where st_gen = v_cur)
       <= (select count(*) from pgque._state_keep(v_cur)) then
        return 0;
    end if;
    if not pgque._flip_lock('pgque.sub_state_' || v_cur) then
        return 0;
    end if;
    perform nextval('pgque.state_gen_seq');
    insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                 st_acked_to, st_delivered_to, st_delivered_all, st_gen, st_moved)
    select k.st_sub, k.st_seq, k.st_time, k.st_last_tick, k.st_next_tick, k.st_batch,
           k.st_acked_to, k.st_delivered_to, k.st_delivered_all, 1 - v_cur, k.st_moved
      from pgque._state_keep(v_cur) k;
    execute format('truncate %s', 'pgque.sub_state_' || v_cur);
    return 1;
end;
$$;

-- _tick_keep(): per queue, the first tick still needed: its oldest cursor
-- (every open batch ends at a later tick), or its latest tick when nobody
-- subscribes. A subscription being registered is not visible yet but holds
-- a key-share lock on its queue row until it commits; so does nothing else
-- for long (the ticker's lock is short): such a queue keeps all its ticks.
-- With i_lock false nothing is locked and registrations are not seen: an
-- estimate, for deciding whether a flip is worth it.
drop function if exists pgque._tick_keep();
create or replace function pgque._tick_keep(i_lock boolean, out o_queue integer, out o_from bigint)
returns setof record language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    for o_queue in select queue_id from pgque.queue order by queue_id loop
        if i_lock then
            perform 1 from pgque.queue where queue_id = o_queue for update skip locked;
        end if;
        if i_lock and not found then
            o_from := 0;
        else
            select min(st.st_last_tick) into o_from
              from pgque.subscription s cross join lateral pgque._sub_state(s.sub_id) st
             where s.sub_queue = o_queue;
            if o_from is null then
                select max(tick_id) into o_from from pgque.tick where tick_queue = o_queue;
            end if;
        end if;
        return next;
    end loop;
end;
$$;

-- _tick_flip(): retires the current tick partition, keeping every tick
-- _tick_keep names. Returns 1 when flipped.
-- Tables: rotation (lock), tick (insert, truncate).
create or replace function pgque._tick_flip()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur  integer;
begin
    perform 1 from pgque.rotation where rot_name = 'tick' for update;
    v_cur := pgque._gen('tick');
    if (select count(*) from pgque.tick where tick_gen = v_cur)
       <= (select count(*) from pgque.tick t join pgque._tick_keep(false) k
              on k.o_queue = t.tick_queue and t.tick_id >= k.o_from
           where t.tick_gen = v_cur) then
        return 0;
    end if;
    if not pgque._flip_lock('pgque.tick_' || v_cur) then
        return 0;
    end if;
    perform nextval('pgque.tick_gen_seq');
    -- Statement snapshots from here on see every committed cursor.
    insert into pgque.tick (tick_queue, tick_id, tick_time, tick_snapshot, tick_event_seq, tick_xid, tick_gen)
    select t.tick_queue, t.tick_id, t.tick_time, t.tick_snapshot, t.tick_event_seq, t.tick_xid, 1 - v_cur
      from pgque.tick t join pgque._tick_keep(true) k on k.o_queue = t.tick_queue and t.tick_id >= k.o_from
     where t.tick_gen = v_cur;
    execute format('truncate %s', 'pgque.tick_' || v_cur);
    return 1;
end;
$$;

drop function if exists pgque._tick_cleanup(integer);

-- maint(): runs rotation for every queue, then the flips of the state log
-- and the ticks (last, so their exclusive locks are held only for the rest
-- of this transaction: a few milliseconds). Returns the
-- number of operations that did something. Like the ticker it refuses to
-- run under REPEATABLE READ or SERIALIZABLE: rotation's safety check must
-- see every transaction that committed before its table lock was granted,
-- and a transaction snapshot may predate them.
create or replace function pgque.maint()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id integer;
    v_n  integer := 0;
begin
    if current_setting('transaction_isolation') <> 'read committed' then
        raise exception using errcode = 'PQ011',
            message = format('maint() must run in READ COMMITTED, not %s', current_setting('transaction_isolation'));
    end if;
    for v_id in select queue_id from pgque.queue order by queue_id loop
        v_n := v_n + pgque._rotate(v_id);
    end loop;
    -- State first: consumers read state before ticks, so taking the locks
    -- in the same order avoids lock cycles with them.
    v_n := v_n + pgque._state_flip();
    v_n := v_n + pgque._tick_flip();
    -- The upper layers' own maintenance (the api layer's dedup rotation).
    v_n := v_n + pgque._maint_hooks();
    return v_n;
end;
$$;


-- ==== engine/functions/pgque.rotation_blockers.sql ====
-- rotation_blockers(): what keeps maint() from rotating each queue's event
-- tables, for the operator to act on. Rotation reclaims space only when no
-- subscription still needs the oldest table, so a consumer that stopped
-- consuming (a forgotten subscription, perhaps a reader's) pins it forever,
-- and a transaction left open after subscribing (which holds a key-share
-- lock on the queue row) makes maint() skip the queue while it lasts.
-- Nothing here is dropped automatically: that would lose events a consumer
-- was promised. The remedies are unregister_consumer / unsubscribe (admin)
-- for a subscription and pg_terminate_backend(pid) for a session.
--
-- A layer can also hold the oldest table for a while after its last write
-- (the dedup keys in it are within their window); that passes by itself.
--
-- Returns one row per blocker: queue, kind ('subscription', 'session' or
-- 'retention'), what (the subscription's name; the session's pid, role and
-- application; what the layer keeps and until when), and since (the
-- subscription's last batch time, the start of the session's transaction,
-- or when the held table stopped being written). Only queues whose rotation is due
-- (rotation_period passed) are listed. Tables: queue, subscription, tick;
-- pg_locks, pg_stat_activity; and what the 'rotate' hooks read.
create or replace function pgque.rotation_blockers()
returns table (queue text, kind text, what text, since timestamptz)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    with due as (
        select q.* from pgque.queue q
         where clock_timestamp() - q.queue_switch_time >= q.queue_rotation_period
    )
    select d.queue_name, 'subscription', s.sub_name, t.tick_time
      from due d
      join pgque.subscription s on s.sub_queue = d.queue_id
      join pgque.tick t on t.tick_queue = s.sub_queue and t.tick_id = s.sub_last_tick
     where t.tick_time < d.queue_switch_time
    union all
    select d.queue_name, 'session',
           format('pid %s, role %s, application %L, %s', a.pid, a.usename, a.application_name, a.state),
           a.xact_start
      from due d
      cross join pg_locks l
      join pg_stat_activity a on a.pid = l.pid
     where l.locktype = 'relation' and l.relation = 'pgque.queue'::regclass and l.granted
       and l.mode = 'RowShareLock' and a.pid <> pg_backend_pid()
       and a.state in ('idle in transaction', 'idle in transaction (aborted)')
    union all
    select d.queue_name, 'retention', h.why, d.queue_retired[(d.queue_cur_table + 1) % d.queue_ntables + 1]
      from due d
      cross join lateral (select pgque._rotate_hold(d.queue_id, (d.queue_cur_table + 1) % d.queue_ntables) as why) h
     where h.why is not null
    order by 1, 2, 4;
$$;


-- ==== engine/functions/pgque.info.sql ====
-- Monitoring.

-- get_queue_info([queue]): one row per queue with its settings, its last
-- tick, ticker_lag (time since the last tick), ev_new (events inserted since
-- the last tick) and ev_per_sec (over the ticks still kept).
create or replace function pgque.get_queue_info(i_queue text default null)
returns table (queue_name text, queue_ntables integer, queue_cur_table integer,
               queue_rotation_period interval, queue_switch_time timestamptz,
               queue_ticker_max_count integer, queue_ticker_max_lag interval,
               queue_ticker_idle_period interval, queue_max_retries integer,
               ticker_lag interval, ev_per_sec double precision, ev_new bigint,
               last_tick_id bigint, retry_pending bigint, dead_letters bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    if i_queue is not null then
        perform pgque._queue(i_queue);
    end if;
    return query
    select q.queue_name, q.queue_ntables, q.queue_cur_table, q.queue_rotation_period, q.queue_switch_time,
           q.queue_ticker_max_count, q.queue_ticker_max_lag, q.queue_ticker_idle_period, q.queue_max_retries,
           clock_timestamp() - lt.tick_time,
           case when ft.tick_id is not null and lt.tick_time > ft.tick_time
                then (lt.tick_event_seq - ft.tick_event_seq)
                     / extract(epoch from lt.tick_time - ft.tick_time)::double precision end,
           greatest(coalesce(pg_sequence_last_value(q.queue_event_seq), 0) - lt.tick_event_seq, 0),
           lt.tick_id,
           (select count(*) from pgque.retry_queue r where r.ev_queue = q.queue_id),
           (select count(*) from pgque.dead_letter d where d.dl_queue = q.queue_id)
      from pgque.queue q
      cross join lateral (select * from pgque.tick t where t.tick_queue = q.queue_id
                           order by t.tick_id desc limit 1) lt
      left join lateral (select * from pgque.tick t where t.tick_queue = q.queue_id
                           order by t.tick_id asc limit 1) ft on true
     where i_queue is null or q.queue_name = i_queue
     order by q.queue_name;
end;
$$;

-- get_consumer_info([queue[, consumer]]): one row per subscription: lag
-- (age of its cursor's tick), last_seen (since it last opened or finished a
-- batch), pending_events (events inserted after its cursor, all keys),
-- its open batch, and its pending retries.
create or replace function pgque.get_consumer_info(i_queue text default null, i_consumer text default null)
returns table (queue_name text, consumer_name text, lag interval, last_seen interval,
               last_tick bigint, current_batch bigint, next_tick bigint,
               pending_events bigint, retry_pending bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
begin
    if i_queue is not null then
        perform pgque._queue(i_queue);
    end if;
    return query
    select q.queue_name, s.sub_name, clock_timestamp() - ct.tick_time, clock_timestamp() - st.st_time,
           st.st_last_tick, st.st_batch, st.st_next_tick,
           greatest(coalesce(pg_sequence_last_value(q.queue_event_seq), 0) - ct.tick_event_seq, 0),
           (select count(*) from pgque.retry_queue r where r.ev_owner = s.sub_id)
      from pgque.subscription s
      join pgque.queue q on q.queue_id = s.sub_queue
      cross join lateral pgque._sub_state(s.sub_id) st
      cross join lateral (select * from pgque.tick t where t.tick_queue = s.sub_queue
                           and t.tick_id = st.st_last_tick limit 1) ct
     where (i_queue is null or q.queue_name = i_queue)
       and (i_consumer is null or s.sub_name = i_consumer)
     order by q.queue_name, s.sub_name;
end;
$$;


-- ==== engine/functions/pgque.set_queue_config.sql ====
-- set_queue_config(queue, param, value): changes one queue setting. Accepts
-- PgQ's names with or without the "queue_" prefix: ticker_max_count
-- (integer >= 1), ticker_max_lag (interval 0 to 1 day), ticker_idle_period
-- (interval > 0, at most 1 day), rotation_period (interval > 0, at most
-- 365 days), max_retries (integer >= 0), and the settings upper layers
-- register in pgque.layer_hook (the api layer's dedup_window). Raises PQ012
-- for an unknown parameter and PQ011 for a
-- value that does not parse or is out of range. Returns 1.
create or replace function pgque.set_queue_config(i_queue text, i_param text, i_value text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q       pgque.queue := pgque._queue(i_queue);
    v_param text := regexp_replace(coalesce(i_param, ''), '^queue_', '');
    v_int   bigint;
    v_ivl   interval;
begin
    if i_param is null or i_value is null then
        raise exception using errcode = '22004', message = 'config parameter and value must not be NULL';
    end if;
    if v_param in ('ticker_max_count', 'max_retries') then
        begin
            v_int := i_value::bigint;
        exception when others then
            raise exception using errcode = 'PQ011', message = format('%s must be an integer, not %L', v_param, i_value);
        end;
        if v_int < (case v_param when 'ticker_max_count' then 1 else 0 end) or v_int > 1000000000 then
            raise exception using errcode = 'PQ011',
                message = format('%s must be between %s and 1000000000, not %s', v_param,
                                 case v_param when 'ticker_max_count' then 1 else 0 end, v_int);
        end if;
    elsif v_param in ('ticker_max_lag', 'ticker_idle_period', 'rotation_period') then
        begin
            v_ivl := i_value::interval;
        exception when others then
            raise exception using errcode = 'PQ011', message = format('%s must be an interval, not %L', v_param, i_value);
        end;
        -- Checked on the real duration: a month is not 30 days. The
        -- message quotes the value as given.
        begin
            v_ivl := pgque._check_interval(v_param, v_ivl,
                         case v_param when 'ticker_max_lag' then interval '0' else interval '1 microsecond' end,
                         case v_param when 'rotation_period' then interval '365 days' else interval '1 day' end);
        exception when sqlstate 'PQ011' then
            raise exception using errcode = 'PQ011', message = format('%s (given as %L)', sqlerrm, i_value);
        end;
    elsif pgque._queue_config_hook(q.queue_id, v_param, i_value) then
        -- A setting of an upper layer (pgque.layer_hook), validated and
        -- stored by that layer.
        return 1;
    else
        raise exception using errcode = 'PQ012',
            message = format('unknown queue parameter %L; known: ticker_max_count, ticker_max_lag, ticker_idle_period, rotation_period, max_retries%s', i_param,
                             (select string_agg(', ' || hook_name, '' order by hook_name) from pgque.layer_hook where hook_kind = 'queue_config'));
    end if;

    update pgque.queue set
        queue_ticker_max_count   = case when v_param = 'ticker_max_count' then v_int::integer else queue_ticker_max_count end,
        queue_max_retries        = case when v_param = 'max_retries' then v_int::integer else queue_max_retries end,
        queue_ticker_max_lag     = case when v_param = 'ticker_max_lag' then v_ivl else queue_ticker_max_lag end,
        queue_ticker_idle_period = case when v_param = 'ticker_idle_period' then v_ivl else queue_ticker_idle_period end,
        queue_rotation_period    = case when v_param = 'rotation_period' then v_ivl else queue_rotation_period end
     where queue_id = q.queue_id;
    return 1;
end;
$$;


-- ==== engine/functions/pgque.schedule.sql ====
-- Ticking from inside the database with pg_cron.
--
-- The Go ticker daemon (`pgque ticker`, or pgque.Ticker in a Go process) is
-- the usual way to tick. Where running a daemon is not an option, start()
-- schedules the same work with pg_cron: a job every minute calls the
-- run_ticker procedure, which ticks every 10 ms, moves due retries every
-- second and runs maint() every 30 seconds for 55 seconds, committing after
-- every round so ticks become visible at once. pg_cron's finest schedule is
-- one minute, hence the loop. run_ticker takes the ticker lease like any
-- ticker daemon, so it never ticks alongside a live daemon.

-- _run_ticker_round(worker, end, next retry, next maint): one round of
-- run_ticker: ticks when worker holds the ticker lease, moves due retries
-- and runs maint() when their time came. Returns whether the loop goes on
-- (end not reached) and the next retry and maint times.
-- Tables: through ticker_lead, ticker, maint_retry_events, maint.
create or replace function pgque._run_ticker_round(i_worker text, i_end timestamptz,
                                                   i_next_retry timestamptz, i_next_maint timestamptz,
                                                   out more boolean, out next_retry timestamptz, out next_maint timestamptz)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    next_retry := i_next_retry;
    next_maint := i_next_maint;
    if pgque.ticker_lead(i_worker, interval '5 seconds') then
        perform pgque.ticker();
        if clock_timestamp() >= next_retry then
            perform pgque.maint_retry_events();
            next_retry := clock_timestamp() + interval '1 second';
        end if;
        if clock_timestamp() >= next_maint then
            perform pgque.maint();
            next_maint := clock_timestamp() + interval '30 seconds';
        end if;
    end if;
    more := clock_timestamp() < i_end;
end;
$$;

-- _run_ticker_end(seconds): validates run_ticker's seconds (1..3600) and
-- returns when the loop ends.
create or replace function pgque._run_ticker_end(i_seconds integer)
returns timestamptz language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_seconds is null or i_seconds < 1 or i_seconds > 3600 then
        raise exception using errcode = 'PQ011', message = format('seconds must be between 1 and 3600, not %s', i_seconds);
    end if;
    return clock_timestamp() + make_interval(secs => i_seconds);
end;
$$;

-- run_ticker(seconds, worker): the ticker loop, for pg_cron or by hand.
-- Returns when seconds have passed. Must be CALLed outside a transaction
-- block (it commits), which rules out SECURITY DEFINER and a pinned
-- search_path for a procedure: it runs as its caller (pgque_admin or the
-- owner) under the caller's search_path. So its body holds no operator
-- and no unqualified type or function at all (an attacker's public.<
-- or public.timestamptz would run as the caller); the work and every
-- comparison happen in _run_ticker_round, which pins its search_path.
create or replace procedure pgque.run_ticker(i_seconds integer default 55, i_worker text default 'pg_cron')
language plpgsql
as $$
declare
    v_end   pg_catalog.timestamptz := pgque._run_ticker_end(i_seconds);
    v_retry pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_maint pg_catalog.timestamptz := pg_catalog.clock_timestamp();
    v_more  pg_catalog.bool := true;
begin
    while v_more loop
        select r.more, r.next_retry, r.next_maint into v_more, v_retry, v_maint
          from pgque._run_ticker_round(i_worker, v_end, v_retry, v_maint) r;
        commit;
        perform pg_catalog.pg_sleep(0.01);
    end loop;
    perform pgque.ticker_resign(i_worker);
    commit;
end;
$$;

-- start(): schedules run_ticker every minute with pg_cron (the extension
-- must be installed in this database). Returns the job id. Idempotent.
create or replace function pgque.start()
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_job bigint;
begin
    if not exists (select 1 from pg_extension where extname = 'pg_cron') then
        raise exception using errcode = 'PQ011',
            message = 'pg_cron is not installed in this database',
            hint = 'add pg_cron to shared_preload_libraries, set cron.database_name to this database, CREATE EXTENSION pg_cron; or run the ticker daemon (pgque ticker)';
    end if;
    execute 'select cron.schedule($1, $2, $3)' into v_job
      using 'pgque_ticker', '* * * * *', 'call pgque.run_ticker(55)';
    return v_job;
end;
$$;

-- stop(): removes the pg_cron job that start() created. Returns true when
-- there was one.
create or replace function pgque.stop()
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_done boolean := false;
begin
    if exists (select 1 from pg_extension where extname = 'pg_cron') then
        execute 'select exists (select 1 from cron.job where jobname = $1)' into v_done using 'pgque_ticker';
        if v_done then
            execute 'select cron.unschedule($1)' using 'pgque_ticker';
        end if;
    end if;
    return v_done;
end;
$$;


-- ==== engine/grants.sql ====
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

grant execute on function
    pgque.dlq_list(text, text, integer)
    to pgque_reader, pgque_admin;

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
    pgque.dlq_replay(text, bigint),
    pgque.dlq_purge(text, text, interval),
    pgque.start(),
    pgque.stop(),
    pgque.grant_queue(text, text, text),
    pgque.revoke_queue(text, text, text),
    pgque.unconfine_queue(text, text),
    pgque.rotation_blockers()
    to pgque_admin;

grant execute on procedure pgque.run_ticker(integer, text) to pgque_admin;
-- run_ticker runs as its caller, so the caller needs its two helpers.
grant execute on function
    pgque._run_ticker_end(integer),
    pgque._run_ticker_round(text, timestamptz, timestamptz, timestamptz)
    to pgque_admin;

-- The admin reads the engine's tables (not a queue's own event tables).
select pgque._grant_select(array['pgque.dead_letter', 'pgque.deferred', 'pgque.event', 'pgque.layer_hook',
        'pgque.queue', 'pgque.queue_grant', 'pgque.retry_queue', 'pgque.rotation',
        'pgque.sub_state', 'pgque.sub_state_0', 'pgque.sub_state_1', 'pgque.subscription',
        'pgque.tick', 'pgque.tick_0', 'pgque.tick_1', 'pgque.ticker_lease', 'pgque.version']::regclass[],
    array['pgque_admin']::regrole[]);


-- ==== api/structure/tables.sql ====
-- API tables.
--
-- Chunk progress (how far the open batch has been handed out and
-- acknowledged) is part of the engine's append-only state log,
-- pgque.sub_state. Installs before it kept one row per subscription in
-- pgque.sub_progress, updated in place: carry an open batch's progress
-- over and drop the table.
do $progress$
begin
    if to_regclass('pgque.sub_progress') is not null then
        insert into pgque.sub_state (st_sub, st_seq, st_time, st_last_tick, st_next_tick, st_batch,
                                     st_acked_to, st_delivered_to, st_delivered_all)
        select s.sub_id, nextval('pgque.sub_state_seq'), s.sub_active, s.sub_last_tick, s.sub_next_tick,
               s.sub_batch, p.acked_to, p.delivered_to, p.delivered_all
          from pgque.sub_progress p
          join pgque.subscription s on s.sub_id = p.sub_id and s.sub_batch = p.batch_id
         where p.delivered_to is not null or p.acked_to is not null;
        drop table pgque.sub_progress;
    end if;
end
$progress$;

-- pgque.message: one delivered event, as receive returns it.
do $message$
begin
    if not exists (select 1 from pg_catalog.pg_type t join pg_catalog.pg_namespace n on n.oid = t.typnamespace
                    where n.nspname = 'pgque' and t.typname = 'message') then
        create type pgque.message as (
            msg_id        bigint,
            batch_id      bigint,
            type          text,
            payload       jsonb,
            retry_count   integer,
            created_at    timestamptz,
            partition_key text,
            extra2        text,
            extra3        text,
            extra4        text
        );
    end if;
end
$message$;


-- ==== api/structure/dedup.sql ====
-- Producer dedup storage.
--
-- A send with a dedup key stores the key in its own event row, in
-- pgque.event.ev_dedup, under a partial unique index on (ev_part,
-- ev_dedup): one key per event table, and no second row or table written
-- for it. The record's time is the event's ev_time (the start of the
-- sending transaction), and it lives as long as the event table: rotation
-- does not truncate a table that stopped being written less than a window
-- ago while it holds keys (the 'rotate' hook _dedup_rotate_hold), and
-- senders look into the tables retired within their window (rare: for one
-- window after each rotation). Sends without a key write NULL there and
-- no index entry.
--
-- A key reused after its window, while its expired row is still in the
-- current table, cannot be stored in the new row (the index holds one
-- row per key and table): that rare case is recorded in two generation
-- tables, pgque.dedup_0
-- and pgque.dedup_1, shared by all queues. Once the current generation is
-- as old as the longest dedup_window of any queue (plus a second), maint()
-- truncates the other one and makes it current: every record in it was
-- written before the current generation began, so it is past every
-- queue's window. These records are append-only too (the one exception: a
-- key reused again after its window overwrites its own record in place).

-- The generation state: which table is current, since when. One row,
-- written by rotation only.
create table if not exists pgque.dedup_state (
    singleton      boolean primary key default true check (singleton),
    ds_cur         integer not null default 0 check (ds_cur in (0, 1)),
    ds_switch_time timestamptz not null default now()
);
insert into pgque.dedup_state default values on conflict do nothing;

-- The two generations. The unique index makes a second inserter of a key
-- see the first's record even where its snapshot cannot (REPEATABLE READ);
-- the send path serialises senders of one key with a transaction advisory
-- lock.
create table if not exists pgque.dedup_0 (
    dd_queue integer not null,
    dd_key   text not null,
    dd_ev_id bigint not null,
    dd_time  timestamptz not null
);
select pgque._create_index('dedup_0_key_idx', $ddl$create unique index dedup_0_key_idx on pgque.dedup_0 (dd_queue, dd_key)$ddl$);
create table if not exists pgque.dedup_1 (
    dd_queue integer not null,
    dd_key   text not null,
    dd_ev_id bigint not null,
    dd_time  timestamptz not null
);
select pgque._create_index('dedup_1_key_idx', $ddl$create unique index dedup_1_key_idx on pgque.dedup_1 (dd_queue, dd_key)$ddl$);

-- The upgrade from the layout that kept every key in dedup_0/1 and the
-- windows in a table pgque.queue_dedup of their own (the key column and
-- the window column are the engine's, added before this runs): each
-- window moves into its queue row, and the newest record of each key into
-- its event's row (at most one key per event table, so the unique index
-- holds); a record whose event is gone is left to expire.
do $dedup_in_events$
begin
    if to_regclass('pgque.queue_dedup') is not null then
        update pgque.queue q set queue_dedup_window = d.qd_window
          from pgque.queue_dedup d where d.qd_queue = q.queue_id;
        update pgque.event e set ev_dedup = r.dd_key
          from (select distinct on (dd_queue, dd_key) dd_queue, dd_key, dd_ev_id
                  from (select * from pgque.dedup_0 union all select * from pgque.dedup_1) a
                 order by dd_queue, dd_key, dd_time desc) r
         where e.ev_part >= r.dd_queue * 16 and e.ev_part < r.dd_queue * 16 + 16 and e.ev_id = r.dd_ev_id;
        drop table pgque.queue_dedup;
    end if;
end
$dedup_in_events$;


-- ==== api/structure/table_source.sql ====
-- Tables attached to queues (attach_table): every INSERT/UPDATE/DELETE on
-- the table emits an event from a trigger whose function is generated at
-- attach time with static SQL (pgque._src_<queue_id>_<table oid>). One row
-- per (queue, table); written only by attach_table and detach_table.
create table if not exists pgque.table_source (
    ts_queue          integer not null references pgque.queue (queue_id) on delete cascade,
    ts_table          oid not null,
    ts_table_name     text not null,      -- schema.table, quoted, as stored in ev_extra2
    ts_key_column     name not null,
    ts_operations     text[] not null,
    ts_columns        text[],             -- keep only these (NULL: all)
    ts_exclude        text[],             -- leave these out (NULL: none)
    ts_skip_unchanged boolean not null,
    ts_when           text,
    ts_function       regprocedure not null,
    ts_attached       timestamptz not null default now(),
    primary key (ts_queue, ts_table)
);


-- ==== api/functions/pgque.dedup.sql ====
-- Producer dedup: an idempotency key on send/send_batch, remembered per
-- queue for a window (set_queue_config(queue, 'dedup_window', ...), default
-- 5 minutes). Storage and rotation are described in api/structure/dedup.sql:
-- the key is kept in its event's row. Keys are per queue (each event table
-- belongs to one queue).
--
-- Concurrency. Senders of one key in one queue are serialised by a
-- transaction-scoped advisory lock on hashtextextended(key,
-- hashtext(queue)) (from the name, so no lookup precedes the lock): the
-- second waits until the first commits or rolls back, then (READ COMMITTED:
-- each statement takes a new snapshot) sees the first's event and returns
-- its ev_id, or finds none and sends. The lock covers every event table of
-- the queue and both generation tables, so a rotation between two senders
-- changes nothing. Under REPEATABLE READ or SERIALIZABLE the waiter's
-- snapshot cannot see what the first one committed, so instead of sending
-- a duplicate it fails with SQLSTATE 40001 (retry the transaction); the
-- unique index raises the same for a row of the current table it cannot
-- see. A hash collision between two keys only makes one wait for the
-- other.

-- _dedup_set_window(queue_id, value): the 'dedup_window' queue setting.
-- value is an interval between 1 second and 7 days; raises PQ011 otherwise.
create or replace function pgque._dedup_set_window(i_queue_id integer, i_value text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_ivl interval;
begin
    begin
        v_ivl := i_value::interval;
    exception when others then
        raise exception using errcode = 'PQ011', message = format('dedup_window must be an interval, not %L', i_value);
    end;
    if v_ivl < interval '1 second' or v_ivl > interval '7 days' then
        raise exception using errcode = 'PQ011',
            message = format('dedup_window must be between 1 second and 7 days, not %s', i_value);
    end if;
    update pgque.queue set queue_dedup_window = v_ivl where queue_id = i_queue_id;
end;
$$;

-- _dedup_rotate(): once the current generation is as old as the longest
-- window of any queue, plus a second of margin, truncates the other
-- generation and makes it current. A record is always written with a time
-- taken before its sender read which generation is current, so a sender
-- that read it just before a switch writes into the older generation a
-- record no younger than the switch: a window later it is expired there
-- too (a record's time is its transaction's start). The truncate waits for
-- every transaction that read or wrote the generation; it waits at most
-- 200 ms and otherwise tries again at the next maint(). Returns 1 when it
-- rotated.
-- Not granted: maint() calls it.
create or replace function pgque._dedup_rotate()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.dedup_state;
    v_max  interval;
    v_next integer;
    v_lt   text := current_setting('lock_timeout');
begin
    select * into s from pgque.dedup_state for update skip locked;
    if not found then
        return 0;
    end if;
    -- With no key stored there is nothing to expire: leave the state row
    -- alone, so a system that uses no dedup keys makes no row version here
    -- (under a held horizon every switch leaves one behind).
    if not exists (select 1 from pgque.dedup_0) and not exists (select 1 from pgque.dedup_1) then
        return 0;
    end if;
    select coalesce(max(coalesce(queue_dedup_window, interval '5 minutes')), interval '5 minutes') into v_max
      from pgque.queue;
    if clock_timestamp() - s.ds_switch_time < v_max + interval '1 second' then
        return 0;
    end if;
    v_next := 1 - s.ds_cur;
    begin
        perform set_config('lock_timeout', '200ms', true);
        if v_next = 0 then
            truncate pgque.dedup_0;
        else
            truncate pgque.dedup_1;
        end if;
        perform set_config('lock_timeout', v_lt, true);
    exception when lock_not_available then
        perform set_config('lock_timeout', v_lt, true);
        return 0;
    end;
    update pgque.dedup_state set ds_cur = v_next, ds_switch_time = clock_timestamp();
    return 1;
end;
$$;

-- _dedup_rotate_hold(queue_id, table_no): the 'rotate' hook. A table that
-- stopped being current less than the queue's window ago and holds keyed
-- events keeps them: every such row is at most as old as that moment, so
-- once the window has passed since then, none is within it. Returns why
-- the table is kept, or NULL. Not granted: rotation calls it.
create or replace function pgque._dedup_rotate_hold(i_queue_id integer, i_table integer)
returns text language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_retired timestamptz;
    v_window  interval;
    v_keys    boolean;
begin
    select queue_retired[i_table + 1], coalesce(queue_dedup_window, interval '5 minutes')
      into v_retired, v_window
      from pgque.queue where queue_id = i_queue_id;
    if v_retired is null or v_retired <= clock_timestamp() - v_window then
        return null;
    end if;
    execute format('select exists (select 1 from %s where ev_part = $1 and ev_dedup is not null)',
                   pgque._event_table(i_queue_id, i_table)) into v_keys using i_queue_id * 16 + i_table;
    if not v_keys then
        return null;
    end if;
    return format('dedup keys in the table written until %s are kept until %s (dedup_window %s)',
                  v_retired, v_retired + v_window, v_window);
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('queue_config', 'dedup_window', 'pgque._dedup_set_window(integer, text)'),
    ('maint', 'dedup_rotate', 'pgque._dedup_rotate()'),
    ('rotate', 'dedup_window', 'pgque._dedup_rotate_hold(integer, integer)')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- _dedup_check_keys(keys): raises PQ063 for an empty key or one longer
-- than 512 bytes, and PQ011 for more than 1000 keys in one call (each
-- distinct key holds a lock-table entry until the transaction ends). NULL
-- elements are allowed (they mean "no key").
create or replace function pgque._dedup_check_keys(i_keys text[])
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_pos integer;
begin
    select u.ord into v_pos from unnest(i_keys) with ordinality u(k, ord)
     where u.k = '' or octet_length(u.k) > 512 order by u.ord limit 1;
    if found then
        raise exception using errcode = 'PQ063',
            message = format('dedup key %s is %s; a dedup key is 1 to 512 bytes, or NULL for none', v_pos,
                             case when i_keys[v_pos] = '' then 'empty'
                                  else format('%s bytes long', octet_length(i_keys[v_pos])) end);
    end if;
    if cardinality(i_keys) > 1000 and (select count(k) from unnest(i_keys) k) > 1000 then
        raise exception using errcode = 'PQ011',
            message = format('%s dedup keys in one call; send at most 1000 keyed events per send_batch',
                             (select count(k) from unnest(i_keys) k));
    end if;
end;
$$;

-- Signatures of an earlier layout of these helpers.
drop function if exists pgque._dedup_lock(integer, text[]);
drop function if exists pgque._dedup_send(integer, text, text, text, text, text);

-- _dedup_lock(queue, keys): takes the advisory lock of every distinct
-- non-NULL key, in lock-key order so two batches cannot deadlock on each
-- other. Outside READ COMMITTED a lock that had to be waited for raises
-- 40001.
create or replace function pgque._dedup_lock(i_queue text, i_keys text[])
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_h bigint;
begin
    for v_h in select distinct hashtextextended(k, hashtext(i_queue)) h from unnest(i_keys) k
                where k is not null order by h loop
        if not pg_try_advisory_xact_lock(v_h) then
            perform pg_advisory_xact_lock(v_h);
            if current_setting('transaction_isolation') <> 'read committed' then
                raise exception using errcode = '40001',
                    message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
            end if;
        end if;
    end loop;
end;
$$;

-- _dedup_side_find(queue_id, key, expire): the ev_id of the key's record
-- in the generation tables written after expire, or NULL. Not granted.
create or replace function pgque._dedup_side_find(i_queue_id integer, i_key text, i_expire timestamptz)
returns bigint language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id bigint;
begin
    select dd_ev_id into v_id from pgque.dedup_0
     where dd_queue = i_queue_id and dd_key = i_key and dd_time > i_expire;
    if not found then
        select dd_ev_id into v_id from pgque.dedup_1
         where dd_queue = i_queue_id and dd_key = i_key and dd_time > i_expire;
    end if;
    return v_id;
end;
$$;

-- _dedup_side_record(queue_id, key, ev_id): records a reused key in the
-- current generation, overwriting the key's expired record there if it has
-- one. With the key's lock held under READ COMMITTED every committed record
-- is visible; under a transaction snapshot a record committed since it was
-- taken is not, and the unique index turns it into a serialisation
-- failure. Not granted.
create or replace function pgque._dedup_side_record(i_queue_id integer, i_key text, i_ev_id bigint)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if (select ds_cur from pgque.dedup_state) = 0 then
        update pgque.dedup_0 set dd_ev_id = i_ev_id, dd_time = now() where dd_queue = i_queue_id and dd_key = i_key;
        if not found then
            insert into pgque.dedup_0 (dd_queue, dd_key, dd_ev_id, dd_time) values (i_queue_id, i_key, i_ev_id, now())
            on conflict (dd_queue, dd_key) do nothing;
        end if;
    else
        update pgque.dedup_1 set dd_ev_id = i_ev_id, dd_time = now() where dd_queue = i_queue_id and dd_key = i_key;
        if not found then
            insert into pgque.dedup_1 (dd_queue, dd_key, dd_ev_id, dd_time) values (i_queue_id, i_key, i_ev_id, now())
            on conflict (dd_queue, dd_key) do nothing;
        end if;
    end if;
    if not found then
        raise exception using errcode = '40001',
            message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
    end if;
end;
$$;

-- _dedup_send(queue, type, data, partition_key, dedup_key, how): with the
-- key's lock held (_dedup_lock), returns the ev_id of the key's event
-- within the queue's window, or sends the event with the key and returns
-- its ev_id. The queue row is read after the lock, so a sender that waited
-- writes where things are now.
--
-- The common case, a fresh key with no rotation in the last window, is
-- one INSERT into the current table: the index that refuses a second row
-- of the key is also the lookup. With how 'catch' (a single send) the
-- refusal is caught as a unique_violation, which costs a subtransaction;
-- INSERT ... ON CONFLICT into the partitioned parent costs more (mapping
-- the arbiter index to the partition scans pg_inherits on every call).
-- send_batch, whose subtransactions would pile up (past 64 they slow
-- every snapshot in the database), uses ON CONFLICT (how 'on conflict').
-- send runs the common case inline and, when the index refused its
-- INSERT, calls this with 'on conflict' (the refusal is then expected, and
-- a rotation in between cannot make it wrong). Only when the index
-- refuses (a retry, or a key reused after its window) is the existing row
-- read; only for a window after a rotation are the retired tables probed;
-- only a key whose expired row is found consults the generation tables.
-- Those rarer steps name their table with dynamic SQL, from the queue id
-- and table number (a query on pgque.event would plan and lock every
-- queue's tables). The window is measured back from now; a key's time is
-- the start of the transaction that sent it.
-- Tables: reads pgque.queue, the queue's event tables (and dedup_state,
-- dedup_0/1); inserts into pgque.event (and dedup_0/1).
-- No SET search_path: it is granted to no one and called only by send and
-- send_batch, SECURITY DEFINER functions that pin search_path, whose
-- setting it runs under; the SET clause cost a keyed send about 3% of its
-- server instructions.
drop function if exists pgque._dedup_send(text, text, text, text, text);
drop function if exists pgque._dedup_send(text, text, text, text, text, boolean);
create or replace function pgque._dedup_send(
    i_queue text, i_type text, i_data text, i_partition_key text, i_dedup_key text, i_how text)
returns bigint language plpgsql
as $$
declare
    v_confined boolean;
    v_qid      integer;
    v_cur      integer;
    v_ntab     integer;
    v_seq      regclass;
    v_switch   timestamptz;
    v_retired  timestamptz[];
    v_expire   timestamptz;
    v_side     boolean := false;
    v_n        integer;
    v_id       bigint;
    v_rid      bigint;
    v_rtime    timestamptz;
begin
    select 'produce' = any (queue_confined), queue_id, queue_cur_table, queue_ntables, queue_event_seq,
           queue_switch_time, queue_retired, clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
      into v_confined, v_qid, v_cur, v_ntab, v_seq, v_switch, v_retired, v_expire
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if v_confined then
        perform pgque._authorize_id(v_qid, 'produce'); -- access check
    end if;

    -- A table retired within the window may hold the key's event (the
    -- last switch is the newest retirement).
    if v_switch > v_expire and v_retired is not null then
        for v_n in 0 .. v_ntab - 1 loop
            continue when v_n = v_cur or not coalesce(v_retired[v_n + 1] > v_expire, false);
            execute format('select ev_id, ev_time from %s where ev_part = $1 and ev_dedup = $2',
                           pgque._event_table(v_qid, v_n))
               into v_rid, v_rtime using v_qid * 16 + v_n, i_dedup_key;
            if v_rtime > v_expire then
                return v_rid;
            end if;
            -- An expired event: the key may have been reused since.
            v_side := v_side or v_rid is not null;
        end loop;
        if v_side then
            v_rid := pgque._dedup_side_find(v_qid, i_dedup_key, v_expire);
            if v_rid is not null then
                return v_rid;
            end if;
        end if;
    end if;

    v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
    if i_how = 'catch' then
        begin
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
            values (v_id, v_qid * 16 + v_cur, i_type, i_data, i_partition_key, i_dedup_key);
            return v_id;
        exception when unique_violation then
            null; -- the current table holds the key: below
        end;
    else
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
        values (v_id, v_qid * 16 + v_cur, i_type, i_data, i_partition_key, i_dedup_key)
        on conflict (ev_part, ev_dedup) where ev_dedup is not null do nothing;
        if found then
            return v_id;
        end if;
    end if;

    -- The current table holds an event of the key: within the window it is
    -- the answer (v_id is left unused, as a rolled-back send leaves one).
    execute format('select ev_id, ev_time from %s where ev_part = $1 and ev_dedup = $2',
                   pgque._event_table(v_qid, v_cur))
       into v_rid, v_rtime using v_qid * 16 + v_cur, i_dedup_key;
    if v_rid is null then
        -- Committed after this transaction's snapshot (REPEATABLE READ):
        -- the index sees it, the snapshot does not.
        raise exception using errcode = '40001',
            message = 'could not serialize send: a concurrent transaction sent the same dedup key; retry the transaction';
    end if;
    if v_rtime > v_expire then
        return v_rid;
    end if;
    if not v_side then
        v_rid := pgque._dedup_side_find(v_qid, i_dedup_key, v_expire);
        if v_rid is not null then
            return v_rid;
        end if;
    end if;
    -- The key is reused after its window, and its expired event still
    -- holds the key's place in this table: the new event goes in without
    -- the key, which is recorded in the generation tables instead.
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
    values (v_id, v_qid * 16 + v_cur, i_type, i_data, i_partition_key);
    perform pgque._dedup_side_record(v_qid, i_dedup_key, v_id);
    return v_id;
end;
$$;


-- ==== api/functions/pgque.send.sql ====
-- Producing.
--
-- send stores the JSON payload as the event's data and the partition key
-- in ev_extra1. send_batch inserts a whole array with one set-based INSERT.

-- send(queue, type, payload, partition_key[, dedup_key]): returns the
-- ev_id. The parameters carry the documented names so that callers can
-- write partition_key => 'tenant-42', dedup_key => 'req-7'; the body uses
-- i_ aliases. With a dedup key, a send of a key already sent to this queue
-- within its dedup_window returns the first event's ev_id and stores
-- nothing (pgque.dedup.sql); without one the feature costs one test here
-- and the key index's predicate test on the insert.
drop function if exists pgque.send(text, text, jsonb, text);
create or replace function pgque.send(queue text, type text, payload jsonb, partition_key text,
                                      dedup_key text default null)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue         alias for $1;
    i_type          alias for $2;
    i_payload       alias for $3;
    i_partition_key alias for $4;
    i_dedup_key     alias for $5;
    v_lock          bigint;
    v_part          integer;
    v_seq           regclass;
    v_id            bigint;
    v_confined      boolean;
    v_switch        timestamptz;
    v_retired       timestamptz[];
    v_expire        timestamptz;
begin
    if i_payload is null or i_type is null then
        raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
    end if;
    if i_dedup_key is null then
        -- What _insert_event does, inlined: one PL/pgSQL call less on the
        -- hot path is about a fifth of its server time.
        select queue_id * 16 + queue_cur_table, queue_event_seq, 'produce' = any (queue_confined)
          into v_part, v_seq, v_confined
          from pgque.queue where queue_name = i_queue;
        if not found then
            perform pgque._raise_no_queue(i_queue);
        end if;
        if v_confined then
            perform pgque._authorize_id(v_part / 16, 'produce'); -- access check
        end if;
        v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
        values (v_id, v_part, i_type, i_payload::text, i_partition_key);
        return v_id;
    end if;
    if i_dedup_key = '' or octet_length(i_dedup_key) > 512 then
        perform pgque._dedup_check_keys(array[i_dedup_key]);
    end if;
    -- The key's lock (see pgque.dedup.sql), then _dedup_send's common
    -- case inline (a fresh key, no rotation within the window, an open
    -- queue: one INSERT, whose unique index is the lookup); anything else,
    -- and a key the index refuses, goes to _dedup_send. Inlined: the
    -- PL/pgSQL call was a quarter of what a key costs a send.
    v_lock := hashtextextended(i_dedup_key, hashtext(i_queue));
    if not pg_try_advisory_xact_lock(v_lock) then
        perform pgque._dedup_lock(i_queue, array[i_dedup_key]);
    end if;
    select queue_id * 16 + queue_cur_table, queue_event_seq, 'produce' = any (queue_confined), queue_switch_time,
           queue_retired, clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
      into v_part, v_seq, v_confined, v_switch, v_retired, v_expire
      from pgque.queue where queue_name = i_queue;
    if found and not v_confined and (v_retired is null or v_switch <= v_expire) then
        v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
        begin
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
            values (v_id, v_part, i_type, i_payload::text, i_partition_key, i_dedup_key);
            return v_id;
        exception when unique_violation then
            -- sent before: _dedup_send finds it
            return pgque._dedup_send(i_queue, i_type, i_payload::text, i_partition_key, i_dedup_key, 'on conflict');
        end;
    end if;
    return pgque._dedup_send(i_queue, i_type, i_payload::text, i_partition_key, i_dedup_key, 'catch');
end;
$$;

-- send(queue, type, payload text, partition_key[, dedup_key]): send for
-- a payload the caller already holds as JSON text (the Go client, psql
-- literals): the same contract and result, without building a jsonb value
-- on the way in and printing it back on the way to the event table. The
-- text is checked with json_in (syntax only, nothing built) and stored as
-- given, whitespace and key order included; consumers read the same jsonb
-- as from the jsonb form. A \u0000 escape, which jsonb refuses, is refused
-- here with jsonb's error (22P05) by a jsonb parse that only payloads with
-- a "\u0000" in their text pay.
create or replace function pgque.send(queue text, type text, payload text, partition_key text,
                                      dedup_key text default null)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue         alias for $1;
    i_type          alias for $2;
    i_payload       alias for $3;
    i_partition_key alias for $4;
    i_dedup_key     alias for $5;
    v_lock          bigint;
    v_part          integer;
    v_seq           regclass;
    v_id            bigint;
    v_confined      boolean;
    v_switch        timestamptz;
    v_retired       timestamptz[];
    v_expire        timestamptz;
begin
    -- One test on the common path: NULLs and the NUL escape take the
    -- branch, valid JSON without "\u0000" does not.
    if i_type is null or i_payload::json is null or strpos(i_payload, E'\\u0000') > 0 then
        if i_payload is null or i_type is null then
            raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
        end if;
        perform i_payload::jsonb;
    end if;
    if i_dedup_key is null then
        -- Inlined _insert_event, as in the jsonb form.
        select queue_id * 16 + queue_cur_table, queue_event_seq, 'produce' = any (queue_confined)
          into v_part, v_seq, v_confined
          from pgque.queue where queue_name = i_queue;
        if not found then
            perform pgque._raise_no_queue(i_queue);
        end if;
        if v_confined then
            perform pgque._authorize_id(v_part / 16, 'produce'); -- access check
        end if;
        v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
        values (v_id, v_part, i_type, i_payload, i_partition_key);
        return v_id;
    end if;
    if i_dedup_key = '' or octet_length(i_dedup_key) > 512 then
        perform pgque._dedup_check_keys(array[i_dedup_key]);
    end if;
    -- The lock and the common case inline, as in the jsonb form.
    v_lock := hashtextextended(i_dedup_key, hashtext(i_queue));
    if not pg_try_advisory_xact_lock(v_lock) then
        perform pgque._dedup_lock(i_queue, array[i_dedup_key]);
    end if;
    select queue_id * 16 + queue_cur_table, queue_event_seq, 'produce' = any (queue_confined), queue_switch_time,
           queue_retired, clock_timestamp() - coalesce(queue_dedup_window, interval '5 minutes')
      into v_part, v_seq, v_confined, v_switch, v_retired, v_expire
      from pgque.queue where queue_name = i_queue;
    if found and not v_confined and (v_retired is null or v_switch <= v_expire) then
        v_id := case when pg_current_xact_id() is not null then nextval(v_seq) end; -- xid first (_tick_due)
        begin
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_dedup)
            values (v_id, v_part, i_type, i_payload, i_partition_key, i_dedup_key);
            return v_id;
        exception when unique_violation then
            return pgque._dedup_send(i_queue, i_type, i_payload, i_partition_key, i_dedup_key, 'on conflict');
        end;
    end if;
    return pgque._dedup_send(i_queue, i_type, i_payload, i_partition_key, i_dedup_key, 'catch');
end;
$$;

create or replace function pgque.send(i_queue text, i_type text, i_payload jsonb)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_payload is null or i_type is null then
        raise exception using errcode = '22004', message = 'event type and payload must not be NULL';
    end if;
    return pgque._insert_event(i_queue, i_type, i_payload::text, null, null, null, null);
end;
$$;

create or replace function pgque.send(i_queue text, i_payload jsonb)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_payload is null then
        raise exception using errcode = '22004', message = 'payload must not be NULL';
    end if;
    return pgque._insert_event(i_queue, 'default', i_payload::text, null, null, null, null);
end;
$$;

-- _send_batch(queue, type, types, payloads, partition_keys, dedup_keys,
-- check): the body of every send_batch form, over payloads as text. Either
-- type is the one type of all the payloads (the single-type forms; types
-- is NULL) or types holds the type of each payload (the mixed forms; type
-- is NULL). check says whether the payloads still need their JSON checked
-- (the text forms) or came as jsonb (the jsonb forms, whose caller parsed
-- them). One INSERT for the whole array; types, partition_keys and
-- dedup_keys are each NULL or as long as payloads. ev_ids are taken in
-- array order, so they are returned in input order. With dedup_keys,
-- elements are sent one by one in order under the locks of all their keys:
-- an element whose key was sent within the window (by an earlier element
-- of the same batch too) gets that event's ev_id, and a NULL element key
-- means no dedup for that element. Not granted: the send_batch entry
-- points call it after their access check, and it runs under their pinned
-- search_path (no SET clause of its own: see _dedup_send). Tables: reads
-- queue; inserts into event (and dedup_0/1).
drop function if exists pgque._send_batch(text, text, text[], text[], text[], boolean);
create or replace function pgque._send_batch(i_queue text, i_type text, i_types text[], i_payloads text[],
                                             i_partition_keys text[], i_dedup_keys text[], i_check boolean)
returns bigint[] language plpgsql
as $$
declare
    v_i    integer;
    v_part integer;
    v_seq  regclass;
    v_ids  bigint[];
    v_xid  xid8;
begin
    if (i_type is null and i_types is null) or i_payloads is null then
        raise exception using errcode = '22004', message = 'event type and payloads must not be NULL';
    end if;
    if array_ndims(i_payloads) > 1 or array_ndims(i_partition_keys) > 1 or array_ndims(i_dedup_keys) > 1
       or array_ndims(i_types) > 1 then
        raise exception using errcode = 'PQ011', message = 'types, payloads and keys must be one-dimensional arrays';
    end if;
    if i_types is not null then
        if coalesce(cardinality(i_types), 0) <> coalesce(cardinality(i_payloads), 0) then
            raise exception using errcode = 'PQ011',
                message = format('%s types for %s payloads; pass one type per payload',
                                 cardinality(i_types), cardinality(i_payloads));
        end if;
        if array_position(i_types, null) is not null then
            raise exception using errcode = '22004',
                message = format('type %s of the batch is NULL', array_position(i_types, null));
        end if;
    end if;
    if i_partition_keys is not null
       and coalesce(cardinality(i_partition_keys), 0) <> coalesce(cardinality(i_payloads), 0) then
        raise exception using errcode = 'PQ011',
            message = format('%s partition keys for %s payloads; pass one key per payload, or NULL',
                             cardinality(i_partition_keys), cardinality(i_payloads));
    end if;
    if i_dedup_keys is not null
       and coalesce(cardinality(i_dedup_keys), 0) <> coalesce(cardinality(i_payloads), 0) then
        raise exception using errcode = 'PQ011',
            message = format('%s dedup keys for %s payloads; pass one key (or NULL) per payload, or NULL',
                             cardinality(i_dedup_keys), cardinality(i_payloads));
    end if;
    if array_position(i_payloads, null) is not null then
        raise exception using errcode = '22004',
            message = format('payload %s of the batch is NULL', array_position(i_payloads, null));
    end if;
    select queue_id * 16 + queue_cur_table, queue_event_seq into v_part, v_seq
      from pgque.queue where queue_name = i_queue;
    if not found then
        perform pgque._raise_no_queue(i_queue);
    end if;
    if coalesce(cardinality(i_payloads), 0) = 0 then
        return '{}';
    end if;

    -- The text form's JSON check (see send): json_in for every payload,
    -- jsonb's for one with a "\u0000", all before any ev_id is taken, so that
    -- a refused batch leaves the queue's sequence (which counts unticked
    -- events) where it was.
    if i_check then
        perform count(case when strpos(p, E'\\u0000') > 0 then p::jsonb::text else p::json::text end)
           from unnest(i_payloads) as p;
    end if;

    if i_dedup_keys is not null then
        perform pgque._dedup_check_keys(i_dedup_keys);
        perform pgque._dedup_lock(i_queue, i_dedup_keys);
        v_ids := '{}';
        for v_i in 1 .. cardinality(i_payloads) loop
            if i_dedup_keys[v_i] is null then
                v_ids := v_ids || pgque._insert_event(i_queue, coalesce(i_types[v_i], i_type), i_payloads[v_i],
                                                      i_partition_keys[v_i], null, null, null);
            else
                v_ids := v_ids || pgque._dedup_send(i_queue, coalesce(i_types[v_i], i_type), i_payloads[v_i],
                                                    i_partition_keys[v_i], i_dedup_keys[v_i], 'on conflict');
            end if;
        end loop;
        return v_ids;
    end if;

    -- The ev_ids are taken first, in input order, and the INSERT pairs
    -- them with the payloads: no RETURNING, no sort to put them back in
    -- order. The transaction's id is taken before them (see _tick_due).
    -- A NULL types array unnests as NULLs beside the payloads, so the one
    -- INSERT serves both forms.
    v_xid := pg_current_xact_id();
    v_ids := array(select nextval(v_seq) from generate_series(1, cardinality(i_payloads)));
    insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1)
    select u.id, v_part, coalesce(u.typ, i_type), u.payload, u.pkey
      from unnest(v_ids, i_payloads, i_partition_keys, i_types) as u(id, payload, pkey, typ);
    return v_ids;
end;
$$;

-- send_batch(queue, type, payloads jsonb[], partition_keys, dedup_keys):
-- sends payloads as one set-based INSERT (see _send_batch); parameters
-- named as documented, aliased i_ in the body. Returns the ev_ids in input
-- order.
drop function if exists pgque.send_batch(text, text, jsonb[], text[]);
create or replace function pgque.send_batch(queue text, type text, payloads jsonb[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_type           alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, i_type, null, i_payloads::text[], i_partition_keys, i_dedup_keys, false);
end;
$$;

-- send_batch(queue, type, payloads text[], partition_keys, dedup_keys): the
-- same for payloads held as JSON text (the Go client): each is checked as
-- the text form of send checks it and stored as given, with no jsonb value
-- built and printed back. Returns the ev_ids in input order. An untyped
-- NULL or array literal for payloads matches both forms: cast it.
create or replace function pgque.send_batch(queue text, type text, payloads text[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_type           alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, i_type, null, i_payloads, i_partition_keys, i_dedup_keys, true);
end;
$$;

-- send_batch(queue, types text[], payloads jsonb[], partition_keys,
-- dedup_keys): a batch of events of several types, in one statement and
-- in input order: types[i] is the type of payloads[i] (the two arrays as
-- long as each other, no NULL type). Otherwise as the single-type form,
-- and as fast (the same _send_batch and the same one INSERT). A call whose
-- second argument is an untyped literal ('T') or text resolves to the
-- single-type form: PostgreSQL prefers the string category for an unknown
-- argument. Returns the ev_ids in input order.
create or replace function pgque.send_batch(queue text, types text[], payloads jsonb[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_types          alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, null, i_types, i_payloads::text[], i_partition_keys, i_dedup_keys, false);
end;
$$;

-- send_batch(queue, types text[], payloads text[], partition_keys,
-- dedup_keys): the mixed-type form for payloads held as JSON text,
-- checked and stored as the single-type text form does. Returns the
-- ev_ids in input order.
create or replace function pgque.send_batch(queue text, types text[], payloads text[],
                                            partition_keys text[] default null,
                                            dedup_keys text[] default null)
returns bigint[] language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue          alias for $1;
    i_types          alias for $2;
    i_payloads       alias for $3;
    i_partition_keys alias for $4;
    i_dedup_keys     alias for $5;
begin
    perform pgque._authorize(i_queue, null, 'produce'); -- access check
    return pgque._send_batch(i_queue, null, i_types, i_payloads, i_partition_keys, i_dedup_keys, true);
end;
$$;


-- ==== api/functions/pgque.table_source.sql ====
-- Trigger-sourced events: attach_table makes every INSERT/UPDATE/DELETE on
-- a table emit one event per row into a queue, in the writing transaction,
-- with a chosen column as partition key.
--
-- The event: ev_type 'insert', 'update' or 'delete'; payload the row as
-- JSON (to_jsonb of the new row, the old row for delete), restricted to the
-- chosen columns; partition key the key column's value as text (NULL key
-- when NULL); ev_extra2 the table as schema.table; for an update ev_extra3
-- is the JSON array of the columns whose values changed. An UPDATE that
-- changes the key emits a 'delete' of the old row on the old key and then an
-- 'insert' of the new row on the new key, both with ev_extra3 = 'moved', so
-- each key's stream stays consistent on its own. TRUNCATE is refused with
-- PQ060 unless 'truncate' is one of the operations, which emits one
-- 'truncate' event with the NULL key.
--
-- Privileges. attach_table runs as its caller (SECURITY INVOKER), who must
-- be allowed to create triggers on the table; the event-writing function it
-- attaches is generated by the SECURITY DEFINER _table_source_define with
-- static SQL (column names from the catalog, quoted with %I; the queue by
-- its numeric id; the table name as a literal with %L), so the table's
-- writers need no pgque
-- grant, and the function refuses to run as a trigger of any other table.

-- _table_source_generate(queue, table, key_column, operations, columns,
-- exclude_columns, when_condition, skip_unchanged, check_privilege):
-- validates an attachment, (re)creates its trigger function
-- pgque._src_<queue_id>_<oid> and records it in pgque.table_source. With
-- check_privilege the session user must hold the TRIGGER privilege on the
-- table. Returns the function. Not granted: _table_source_define (the
-- caller's path) and the install's regeneration call it.
create or replace function pgque._table_source_generate(
    i_queue text, i_table regclass, i_key_column text, i_operations text[],
    i_columns text[], i_exclude text[], i_when text, i_skip_unchanged boolean,
    i_check_privilege boolean)
returns regprocedure language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q        pgque.queue := pgque._queue(i_queue);
    v_kind   "char";
    v_nsp    name;
    v_tname  text;
    v_row    text;
    v_pays   text[];
    v_fname  text;
    v_col    text;
    v_trunc  text;
    v_body   text;
    v_fn     regprocedure;
begin
    if i_table is null or i_key_column is null or i_operations is null or i_skip_unchanged is null then
        raise exception using errcode = '22004', message = 'table, key column, operations and skip_unchanged must not be NULL';
    end if;
    select c.relkind, n.nspname, format('%I.%I', n.nspname, c.relname) into v_kind, v_nsp, v_tname
      from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where c.oid = i_table;
    if v_kind not in ('r', 'p') then
        raise exception using errcode = 'PQ011', message = format('%s is not a table', i_table);
    end if;
    if v_nsp = 'pgque' then
        raise exception using errcode = 'PQ011', message = 'pgque''s own tables cannot be attached';
    end if;
    if i_check_privilege and not pg_catalog.has_table_privilege(session_user, i_table, 'TRIGGER') then
        raise exception using errcode = '42501',
            message = format('role %s may not create triggers on %s', session_user, v_tname);
    end if;
    foreach v_col in array array[i_key_column] || coalesce(i_columns, '{}') || coalesce(i_exclude, '{}') loop
        if v_col is null or not exists (select 1 from pg_catalog.pg_attribute
                                          where attrelid = i_table and attname = v_col
                                            and attnum > 0 and not attisdropped) then
            raise exception using errcode = '42703',
                message = format('column %s does not exist in %s', coalesce(quote_ident(v_col), 'NULL'), v_tname);
        end if;
    end loop;
    if i_columns is not null and i_exclude is not null then
        raise exception using errcode = 'PQ011', message = 'pass columns to keep or columns to leave out, not both';
    end if;

    -- The row as JSON, restricted to the chosen columns. Done on to_jsonb of
    -- the whole row (rather than naming each column) so that a column
    -- dropped later simply disappears from the payload.
    -- The row as JSON, restricted to the chosen columns. Done on to_jsonb of
    -- the whole row (rather than naming each column) so that a column
    -- dropped later simply disappears from the payload.
    foreach v_row in array array['new', 'old'] loop
        v_pays := v_pays || case
            when i_columns is not null then format(
                'coalesce((select pg_catalog.jsonb_object_agg(e.key, e.value) from pg_catalog.jsonb_each(pg_catalog.to_jsonb(%s)) e where e.key operator(pg_catalog.=) any (%L::text[])), ''{}'')',
                v_row, i_columns)
            when i_exclude is not null then format('(pg_catalog.to_jsonb(%s) operator(pg_catalog.-) %L::text[])', v_row, i_exclude)
            else format('pg_catalog.to_jsonb(%s)', v_row) end;
    end loop;
    -- The TRUNCATE trigger fires before the table is touched, so it takes
    -- the transaction's id before the event's (see _tick_due); the row
    -- triggers fire after the row is written, which took it.
    v_trunc := case when 'truncate' = any (i_operations)
        then format('insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra2) values (case when pg_catalog.pg_current_xact_id() is not null then pg_catalog.nextval(v_seq) end, v_part, ''truncate'', pg_catalog.jsonb_build_object(''table'', %L)::text, %L);',
                    v_tname, v_tname)
        else format('raise exception using errcode = ''PQ060'', message = %L;',
                    format('%s is attached to queue %s: TRUNCATE would bypass its events; detach it first, or attach with operation truncate',
                           v_tname, q.queue_name)) end;
    v_fname := format('_src_%s_%s', q.queue_id, i_table::oid);

    v_body := format($body$
create or replace function pgque.%1$I() returns trigger language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $fn$
-- Generated by pgque.attach_table for table %2$s and queue %3$s.
declare
    v_new  jsonb;
    v_old  jsonb;
    v_part integer;
    v_seq  regclass;
begin
    if tg_relid operator(pg_catalog.<>) %4$s::oid
       and not exists (select 1 from pg_catalog.pg_partition_ancestors(tg_relid) a where a.relid operator(pg_catalog.=) %4$s::oid) then
        raise exception using errcode = '42501', message = 'this pgque trigger function belongs to table ' || %2$L;
    end if;
    -- The queue's current event table and sequence, read per row as
    -- _insert_event does (inlined: one call less per row).
    select q.queue_id operator(pg_catalog.*) 16 operator(pg_catalog.+) q.queue_cur_table, q.queue_event_seq
      into v_part, v_seq from pgque.queue q where q.queue_id operator(pg_catalog.=) %10$s;
    if tg_op = 'TRUNCATE' then
        %5$s
        return null;
    end if;
    if tg_op = 'INSERT' then
        v_new := %6$s;
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
            values (pg_catalog.nextval(v_seq), v_part, 'insert', v_new::text, new.%7$I::text, %2$L, null);
    elsif tg_op = 'DELETE' then
        v_old := %8$s;
        insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
            values (pg_catalog.nextval(v_seq), v_part, 'delete', v_old::text, old.%7$I::text, %2$L, null);
    else
        v_new := %6$s;
        v_old := %8$s;
        if new.%7$I::text is distinct from old.%7$I::text then
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
            values (pg_catalog.nextval(v_seq), v_part, 'delete', v_old::text, old.%7$I::text, %2$L, 'moved');
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
            values (pg_catalog.nextval(v_seq), v_part, 'insert', v_new::text, new.%7$I::text, %2$L, 'moved');
        elsif not (%9$L::boolean and v_new operator(pg_catalog.=) v_old) then
            insert into pgque.event (ev_id, ev_part, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3)
            values (pg_catalog.nextval(v_seq), v_part, 'update', v_new::text, new.%7$I::text, %2$L,
                    (select coalesce(pg_catalog.jsonb_agg(n.key order by n.key), '[]')::text
                       from pg_catalog.jsonb_each(v_new) n where (v_old operator(pg_catalog.->) n.key) is distinct from n.value));
        end if;
    end if;
    return null;
end;
$fn$
$body$, v_fname, v_tname, q.queue_name, i_table::oid, v_trunc,
        v_pays[1], i_key_column, v_pays[2], i_skip_unchanged, q.queue_id);
    execute v_body;
    v_fn := format('pgque.%I()', v_fname)::regprocedure;
    execute format('revoke all on function %s from public', v_fn);
    execute format('grant execute on function %s to pgque_admin', v_fn);

    insert into pgque.table_source (ts_queue, ts_table, ts_table_name, ts_key_column, ts_operations,
                                    ts_columns, ts_exclude, ts_skip_unchanged, ts_when, ts_function)
    values (q.queue_id, i_table, v_tname, i_key_column, i_operations, i_columns, i_exclude,
            i_skip_unchanged, i_when, v_fn)
    on conflict (ts_queue, ts_table) do update set
        ts_table_name = excluded.ts_table_name, ts_key_column = excluded.ts_key_column,
        ts_operations = excluded.ts_operations, ts_columns = excluded.ts_columns,
        ts_exclude = excluded.ts_exclude, ts_skip_unchanged = excluded.ts_skip_unchanged,
        ts_when = excluded.ts_when, ts_function = excluded.ts_function, ts_attached = now();
    return v_fn;
end;
$$;


-- _table_source_define(queue, table, key_column, operations, columns,
-- exclude_columns, when_condition, skip_unchanged): attach_table's
-- privileged step, _table_source_generate checking that the session user
-- may create triggers on the table. Returns the trigger function.
create or replace function pgque._table_source_define(
    i_queue text, i_table regclass, i_key_column text, i_operations text[],
    i_columns text[], i_exclude text[], i_when text, i_skip_unchanged boolean)
returns regprocedure language sql security definer
set search_path = pg_catalog, pg_temp
as $$ select pgque._table_source_generate(i_queue, i_table, i_key_column, i_operations,
                                          i_columns, i_exclude, i_when, i_skip_unchanged, true) $$;

-- Re-applying the install regenerates every attachment's trigger function
-- from its recorded options, so the functions (which write pgque.event
-- directly) follow changes to the event layout. An attachment that no
-- longer validates (its key column renamed or dropped) keeps its function
-- and is reported.
do $regen$
declare
    r record;
begin
    for r in select ts.*, q.queue_name from pgque.table_source ts join pgque.queue q on q.queue_id = ts.ts_queue
              where exists (select 1 from pg_catalog.pg_class c where c.oid = ts.ts_table) loop
        begin
            perform pgque._table_source_generate(r.queue_name, r.ts_table::regclass, r.ts_key_column,
                                                 r.ts_operations, r.ts_columns, r.ts_exclude, r.ts_when,
                                                 r.ts_skip_unchanged, false);
        exception when others then
            raise warning 'pgque: table % attached to queue % was not regenerated: %',
                r.ts_table_name, r.queue_name, sqlerrm;
        end;
    end loop;
end
$regen$;

-- attach_table(queue, source_table, key_column[, operations, columns,
-- exclude_columns, when_condition, skip_unchanged]): makes every row the
-- table's writers insert, update or delete emit an event into queue, keyed
-- by key_column. operations: any of insert, update, delete, truncate
-- (default the first three); columns: keep only these in the payload;
-- exclude_columns: leave these out; when_condition: an SQL boolean
-- expression over NEW/OLD, exactly as in CREATE TRIGGER ... WHEN (it is
-- parsed with search_path = pg_catalog, so qualify your own functions);
-- skip_unchanged: emit nothing for an update that changes no kept column.
-- Re-attaching replaces the previous options. SECURITY INVOKER: the caller
-- needs the TRIGGER privilege on the table (owner) and pgque_admin; the
-- condition is the caller's own SQL, run with the caller's rights.
-- Creates triggers pgque_q<queue_id> (rows) and pgque_q<queue_id>_truncate
-- on the table. Returns 1.
create or replace function pgque.attach_table(
    queue text, source_table regclass, key_column text,
    operations text[] default array['insert', 'update', 'delete'],
    columns text[] default null, exclude_columns text[] default null,
    when_condition text default null, skip_unchanged boolean default true)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue      alias for $1;
    i_table      alias for $2;
    i_key_column alias for $3;
    i_operations alias for $4;
    i_columns    alias for $5;
    i_exclude    alias for $6;
    i_when       alias for $7;
    i_skip       alias for $8;
    v_ops        text[];
    v_fn         regprocedure;
    v_trg        text;
    v_row_ops    text;
begin
    select array_agg(distinct lower(o) order by lower(o)) into v_ops from unnest(i_operations) o;
    if v_ops is null or not v_ops <@ array['delete', 'insert', 'truncate', 'update'] or array_position(v_ops, null) is not null then
        raise exception using errcode = 'PQ011',
            message = format('operations must be a non-empty list of insert, update, delete, truncate, not %L', i_operations);
    end if;
    if i_when is not null and btrim(i_when) = '' then
        raise exception using errcode = 'PQ011', message = 'when_condition must not be empty; pass NULL for none';
    end if;
    v_fn := pgque._table_source_define(i_queue, i_table, i_key_column, v_ops, i_columns, i_exclude, i_when, i_skip);
    v_trg := pgque._table_source_trigger_name(i_queue);
    execute format('drop trigger if exists %I on %s', v_trg, i_table);
    execute format('drop trigger if exists %I on %s', v_trg || '_truncate', i_table);
    select string_agg(upper(o), ' or ') into v_row_ops from unnest(v_ops) o where o <> 'truncate';
    if v_row_ops is not null then
        execute format('create trigger %I after %s on %s for each row %s execute function %s()',
                       v_trg, v_row_ops, i_table,
                       case when i_when is null then '' else 'when (' || i_when || ')' end,
                       v_fn::regproc);
    end if;
    execute format('create trigger %I before truncate on %s for each statement execute function %s()',
                   v_trg || '_truncate', i_table, v_fn::regproc);
    return 1;
end;
$$;

-- _table_source_trigger_name(queue): the name of queue's triggers on an
-- attached table, pgque_q<queue_id>. Raises PQ001 for an unknown queue.
create or replace function pgque._table_source_trigger_name(i_queue text)
returns text language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$ select 'pgque_q' || (pgque._queue(i_queue)).queue_id $$;

-- _table_source_forget(queue, table): after the table's triggers are gone,
-- drops the generated function and the attachment record. Raises PQ061
-- when the table is not attached to the queue, PQ062 while its triggers
-- still exist. Returns 1.
create or replace function pgque._table_source_forget(i_queue text, i_table regclass)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q    pgque.queue := pgque._queue(i_queue);
    v_fn regprocedure;
begin
    delete from pgque.table_source where ts_queue = q.queue_id and ts_table = i_table
    returning ts_function into v_fn;
    if not found then
        raise exception using errcode = 'PQ061', message = format('%s is not attached to queue %s', i_table, i_queue);
    end if;
    -- The row's delete trigger dropped the function.
    return 1;
end;
$$;

-- detach_table(queue, source_table): removes the triggers attach_table
-- made, so the table's writes emit nothing more (events already sent
-- stay). SECURITY INVOKER: the caller must own the table and hold
-- pgque_admin. Raises PQ061 when the table is not attached. Returns 1.
create or replace function pgque.detach_table(queue text, source_table regclass)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    i_queue alias for $1;
    i_table alias for $2;
    v_trg   text := pgque._table_source_trigger_name(i_queue);
begin
    if i_table is null then
        raise exception using errcode = '22004', message = 'table must not be NULL';
    end if;
    execute format('drop trigger if exists %I on %s', v_trg, i_table);
    execute format('drop trigger if exists %I on %s', v_trg || '_truncate', i_table);
    return pgque._table_source_forget(i_queue, i_table);
end;
$$;

-- attached_tables(): every attachment: queue, table (schema.table, or
-- NULL when the table was dropped), key column and options.
create or replace function pgque.attached_tables()
returns table (queue text, source_table text, key_column text, operations text[],
               columns text[], exclude_columns text[], when_condition text,
               skip_unchanged boolean, attached timestamptz)
language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select q.queue_name,
           case when exists (select 1 from pg_catalog.pg_class c where c.oid = ts.ts_table) then ts.ts_table_name end,
           ts.ts_key_column::text, ts.ts_operations, ts.ts_columns, ts.ts_exclude, ts.ts_when,
           ts.ts_skip_unchanged, ts.ts_attached
      from pgque.table_source ts join pgque.queue q on q.queue_id = ts.ts_queue
     order by q.queue_name, ts.ts_table_name
$$;

-- _table_source_cleanup(): maint hook. Forgets attachments whose table was
-- dropped (its triggers went with it) and drops their functions. Returns
-- the number forgotten.
create or replace function pgque._table_source_cleanup()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_n  integer := 0;
begin
    -- The rows' delete trigger drops their functions.
    delete from pgque.table_source ts
     where not exists (select 1 from pg_catalog.pg_class c where c.oid = ts.ts_table);
    get diagnostics v_n = row_count;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'table_source_cleanup', 'pgque._table_source_cleanup()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- Guard on pgque.table_source. A queue with attached tables cannot be
-- dropped (the cascade from pgque.queue deletes their rows here): the
-- tables' writes would start failing. An attachment row may only go once
-- its triggers are gone (detach_table dropped them, or the table was
-- dropped); then its function goes with it.
create or replace function pgque._table_source_row_guard()
returns trigger language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if tg_when = 'BEFORE' then
        if exists (select 1 from pg_catalog.pg_trigger where tgfoid = old.ts_function::oid) then
            raise exception using errcode = 'PQ062',
                message = format('%s is still attached to queue %s: detach it first (pgque.detach_table)',
                                 old.ts_table_name, (select queue_name from pgque.queue where queue_id = old.ts_queue));
        end if;
        return old;
    end if;
    execute format('drop function if exists %s', old.ts_function);
    return null;
end;
$$;

do $trg$
begin
    if not exists (select 1 from pg_catalog.pg_trigger
                    where tgrelid = 'pgque.table_source'::regclass and tgname = 'pgque_table_source_guard') then
        create trigger pgque_table_source_guard before delete on pgque.table_source
            for each row execute function pgque._table_source_row_guard();
    end if;
    if not exists (select 1 from pg_catalog.pg_trigger
                    where tgrelid = 'pgque.table_source'::regclass and tgname = 'pgque_table_source_drop_function') then
        create trigger pgque_table_source_drop_function after delete on pgque.table_source
            for each row execute function pgque._table_source_row_guard();
    end if;
end
$trg$;


-- ==== api/functions/pgque.subscribe.sql ====
-- _check_consumer(name): validates a consumer name given by a user. "#"
-- and "/" are reserved: the partition layer names slot subscriptions
-- "<consumer>#<slot>/<nslots>".
create or replace function pgque._check_consumer(i_name text)
returns text language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if strpos(i_name, '#') > 0 or strpos(i_name, '/') > 0 then
        raise exception using errcode = 'PQ010',
            message = format('consumer name %L uses a reserved character: "#" and "/" name slot subscriptions', i_name);
    end if;
    return pgque._check_name('consumer', i_name);
end;
$$;

-- subscribe(queue, consumer): registers a plain consumer. "#" and "/" are
-- reserved for slot subscriptions and rejected here. Returns 1 when new,
-- 0 when it existed.
create or replace function pgque.subscribe(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_queue integer;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    v_queue := (pgque._queue(i_queue)).queue_id;
    perform pgque._check_consumer(i_consumer);
    perform pgque._make_reader(v_queue, 1, false); -- see deliver_raw.sql, "Readers"
    return pgque.register_consumer(i_queue, i_consumer);
end;
$$;

-- unsubscribe(queue, consumer): removes a plain consumer with its open
-- batch and pending retries. Returns 1 when removed, 0 when it was not
-- subscribed.
create or replace function pgque.unsubscribe(i_queue text, i_consumer text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._queue(i_queue);
    perform pgque._check_consumer(i_consumer);
    if not exists (select 1 from pgque.subscription s join pgque.queue q on q.queue_id = s.sub_queue
                    where q.queue_name = i_queue and s.sub_name = i_consumer) then
        return 0;
    end if;
    return pgque.unregister_consumer(i_queue, i_consumer);
end;
$$;


-- ==== api/functions/pgque.deliver.sql ====
-- Chunked delivery of batches: the acknowledgement (_ack) shared by every
-- receive, and the text-predicate form of delivery (_deliver).
--
-- A batch is handed out in chunks of at most max rows in ev_id order. A
-- chunk is redelivered until it is acknowledged (at-least-once, no session
-- state). Acknowledging the chunk that reaches the batch's end finishes the
-- batch; the batch can never be finished past rows nobody received.
-- Batches that hold nothing for the consumer are finished at once, so its
-- cursor keeps moving. Both functions reach the engine through its
-- internal batch functions (_open_batch, _batch_rows, _finish); i_where is
-- a trusted predicate (NULL, or built by the partition layer from integers).

-- _and(where, after): i_where combined with "ev_id > after".
create or replace function pgque._and(i_where text, i_after bigint)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select case
        when i_after is null then i_where
        when i_where is null then 'ev_id > ' || i_after
        else '(' || i_where || ') and ev_id > ' || i_after
    end
$$;

-- _payload(data): the event data as jsonb; data that cannot be read as
-- jsonb (not JSON, or JSON that jsonb refuses: a \u0000 escape, a number out
-- of range, nesting past the stack limit) is returned as a JSON string of
-- the stored text rather than failing the whole chunk. Only insert_event
-- can store such data; send stores JSON.
create or replace function pgque._payload(i_data text)
returns jsonb language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    return i_data::jsonb;
exception when others then
    return to_jsonb(i_data);
end;
$$;

-- _chunk_bytes(): the byte budget of one chunk (sum of the events' data).
-- A chunk holds at least one event, so a single event larger than the
-- budget is delivered alone; otherwise its events' data add up to at most
-- the budget.
create or replace function pgque._chunk_bytes()
returns bigint language sql immutable
as $$ select 33554432::bigint $$;

-- _deliver(queue, subscription, max, where, span): the next unacknowledged
-- chunk of the subscription's open batch (opening one if needed; span is
-- _open_batch's catch-up bound), for a trusted predicate given as SQL text.
-- receive, receive_raw and receive_partitioned use _deliver_raw
-- (pgque.deliver_raw.sql), which hands out the same chunks at less cost;
-- this form is kept for callers that still pass a predicate. A chunk is at most max events and at most
-- _chunk_bytes() of data. One event past the chunk is looked at, so the
-- state records whether the chunk reaches the batch's end and ack needs no
-- second read. Tables: sub_state (insert when the delivered range changes).
drop function if exists pgque._deliver(text, text, integer, text);
create or replace function pgque._deliver(i_queue text, i_sub text, i_max integer, i_where text, i_span bigint)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
    s       pgque.subscription;
    st      pgque.sub_state;
    v_batch bigint;
    v_where text;
    v_rows  pgque.message[];
    v_n     integer;
    v_total bigint;
    v_all   boolean;
    v_empty integer := 0;
begin
    if i_max is null then
        raise exception using errcode = '22004', message = 'max must not be NULL';
    end if;
    if i_max < 1 or i_max > 100000 then
        raise exception using errcode = 'PQ011', message = format('max must be between 1 and 100000, not %s', i_max);
    end if;
    -- The row alone (its state is read under the lock below); the full
    -- lookup only to raise the right error.
    select s1.* into s from pgque.subscription s1 join pgque.queue q on q.queue_id = s1.sub_queue
     where q.queue_name = i_queue and s1.sub_name = i_sub;
    if not found then
        s := pgque._subscription(i_queue, i_sub);
    end if;
    loop
        st := pgque._open_batch(s.sub_id, s.sub_queue, i_span);
        v_batch := st.st_batch;
        if v_batch is null then
            return;
        end if;
        v_where := pgque._and(i_where, st.st_acked_to);
        s.sub_last_tick := st.st_last_tick;
        s.sub_next_tick := st.st_next_tick;
        s.sub_batch := v_batch;
        -- The chunk in one statement. Payloads written by send are JSON; only
        -- insert_event can store other text, and then the chunk is read
        -- again with such data wrapped as a JSON string (one subtransaction
        -- per chunk, none per row).
        begin
            select array_agg(row(g.ev_id, v_batch, g.ev_type, g.ev_data::jsonb, coalesce(g.ev_retry, 0), g.ev_time,
                                 g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message order by g.ev_id),
                   max(g.total)
              into v_rows, v_total
              from (select g0.*, row_number() over w as rn, count(*) over () as total,
                           coalesce(sum(octet_length(g0.ev_data)) over w, 0) as run
                      from pgque._batch_rows(s, v_where, i_max + 1) g0
                    window w as (order by g0.ev_id rows unbounded preceding)) g
             where g.rn <= i_max and (g.rn = 1 or g.run <= pgque._chunk_bytes());
        exception when data_exception or program_limit_exceeded then
            select array_agg(row(g.ev_id, v_batch, g.ev_type, pgque._payload(g.ev_data), coalesce(g.ev_retry, 0), g.ev_time,
                                 g.ev_extra1, g.ev_extra2, g.ev_extra3, g.ev_extra4)::pgque.message order by g.ev_id),
                   max(g.total)
              into v_rows, v_total
              from (select g0.*, row_number() over w as rn, count(*) over () as total,
                           coalesce(sum(octet_length(g0.ev_data)) over w, 0) as run
                      from pgque._batch_rows(s, v_where, i_max + 1) g0
                    window w as (order by g0.ev_id rows unbounded preceding)) g
             where g.rn <= i_max and (g.rn = 1 or g.run <= pgque._chunk_bytes());
        end;
        v_n := coalesce(cardinality(v_rows), 0);
        if v_n > 0 then
            v_all := v_n >= v_total;
            if st.st_delivered_to is distinct from (v_rows[v_n]).msg_id or st.st_delivered_all is distinct from v_all then
                st.st_delivered_to := (v_rows[v_n]).msg_id;
                st.st_delivered_all := v_all;
                perform pgque._put_state(st);
            end if;
            return query select * from unnest(v_rows);
            return;
        end if;
        -- Nothing (left) for this consumer in the batch: finish it, go on.
        perform pgque._finish(st);
        v_empty := v_empty + 1;
        if v_empty >= 100 then
            return;
        end if;
    end loop;
end;
$$;

-- _ack(batch_id, where): acknowledges the chunk the last delivery handed
-- out. Returns 1 when that finished the batch, 0 when rows remain (or
-- nothing had been handed out). Whether rows remain was recorded by the
-- delivery (it looked one event past the chunk), so the batch is never
-- finished past rows nobody received. i_where is unused (the delivery
-- applied it); it is kept for the callers' signature.
-- Tables: sub_state (insert), subscription (lock).
create or replace function pgque._ack(i_batch_id bigint, i_where text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_batch_id is null then
        raise exception using errcode = '22004', message = 'batch id must not be NULL';
    end if;
    st := pgque._lock_sub((i_batch_id % 1048576)::integer);
    if st.st_batch is distinct from i_batch_id then
        raise exception using errcode = 'PQ020', message = format('batch %s is not open', i_batch_id);
    end if;
    if st.st_delivered_to is null then
        return 0;
    end if;
    if not st.st_delivered_all then
        st.st_acked_to := st.st_delivered_to;
        st.st_delivered_to := null;
        perform pgque._put_state(st);
        return 0;
    end if;
    perform pgque._finish(st);
    return 1;
end;
$$;


-- ==== api/functions/pgque.deliver_raw.sql ====
-- The read path: chunked delivery with the payload as stored (text).
--
-- _deliver_raw is what receive, receive_raw and receive_partitioned run. It
-- keeps _deliver's contract (chunks of at most max rows and _chunk_bytes()
-- of data, redelivered until acknowledged, the state recording whether a
-- chunk reached the batch's end) at a lower cost per chunk: the batch is
-- read by one static statement (the slot predicate takes the slot and the
-- slot count as parameters), which cuts and returns the chunk in one pass;
-- every state change of the call is made in memory and appended as one
-- record; and the payload is handed out as the stored text, so nothing
-- parses it. Callers that promise jsonb cast it themselves. A chunk of a
-- batch far larger than a chunk is read from a window of ev_ids past the
-- acknowledged ones, so draining a batch costs in proportion to its size.
-- See "The read path" and "Large batches" in docs/design.md.

-- _deliver_raw(queue, subscription, max, slot, nslots, span, ack_batch):
-- the next unacknowledged chunk of the subscription's open batch, opening
-- one if needed (span: _batch_end's catch-up bound), restricted to slot of
-- nslots when nslots is greater than 1 (the routing rule of _slot_filter,
-- G1). With ack_batch, the chunk last handed out from that batch is
-- acknowledged first, as _ack would (PQ020 when it is not the open batch).
-- Returns the chunk's events in ev_id order, payload as stored. Every step
-- (acknowledge, finish, open, hand out) works on the state in memory under
-- the subscription's lock and the call appends at most one record, the
-- final state; a poll that finds nothing, or a redelivery, appends none.
-- Tables: event, tick (read), sub_state (insert), subscription (lock).
-- _deliver_raw has a second entry point, receive_raw (api/functions/
-- pgque.receive.sql documents it), made from the same body here, and a
-- third in the partition layer, receive_partitioned_raw, made from it by
-- way of _deliver_raw_body(). Why one body: a
-- PL/pgSQL function that returns another's rows with RETURN QUERY copies
-- every row into a second result store, a fifth of the read's server time
-- when receive_raw called _deliver_raw. The body is one constant of this
-- script; the entry point adds its own parameters' aliases (at
-- <declare>) and its access checks (at <entry>), and
-- receive_partitioned_raw the lease's epoch to every row (at <epoch>)
-- and what a receive that found nothing does (at <done>).
do $deliver_raw$
declare
    -- A chunk statement's rows: the queue's events (v_from, the columns
    -- and the queue's partitions), of the batch (a part of it, below), for
    -- this consumer and slot (v_mine), past the acknowledged ones.
    v_from constant text := $from$select ev.ev_id, ev.ev_type, ev.ev_data, ev.ev_retry, ev.ev_time,
                 ev.ev_extra1, ev.ev_extra2, ev.ev_extra3, ev.ev_extra4
            from pgque.event ev
           where ev.ev_part >= v_queue * 16 and ev.ev_part < v_queue * 16 + 16$from$;
    v_mine constant text := $mine$
             and pg_visible_in_snapshot(ev.ev_txid, v_cur)
             and (ev.ev_owner is null or ev.ev_owner = v_sub)
             and (i_nslots is null or i_nslots = 1
                  or (case when ev.ev_extra1 is null then 0
                           else (hashtextextended(ev.ev_extra1, 0) % i_nslots + i_nslots) % i_nslots end) = i_slot)$mine$;
    -- The rows both chunk statements cut: the batch's next max+1 rows
    -- past the acknowledged ones, for this consumer (and slot), in ev_id
    -- order. Put in at <rows>. The batch's two parts (the ev_txid range,
    -- the previous tick's running transactions) are two scans, each an
    -- index range on its ev_txid: written as one OR, the planner may find
    -- no index that bounds both and scan a routing index by slot alone,
    -- reading every row of the slot in the table (it does on a table
    -- without statistics: a new queue, a table rotation just emptied).
    -- No xid is in both parts.
    v_rows constant text := '(select u.* from (' || v_from || $rows$
             and ev.ev_txid >= pg_snapshot_xmax(v_prev) and ev.ev_txid < pg_snapshot_xmax(v_cur)
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$
          union all
          $rows$ || v_from || $rows$
             and cardinality(v_xip) > 1 and ev.ev_txid = any(v_xip)
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$) u
           order by u.ev_id
           limit i_max + 1)$rows$;
    -- The same rows as a reader reads them (see "Readers" below): its plan
    -- is made without the values of the list of running transactions, so
    -- they are probed one by one (an index seek per xid; the LIMIT keeps
    -- the planner from turning the lateral probe into a join), lest the
    -- plan bound that scan by ev_id alone and test the xids on every row
    -- of the slot. Inline, with the list's values known, the plain list
    -- plans as well and costs less to plan (the probe's subquery would be
    -- planned even when the list is only the 0).
    v_rrows constant text := '(select u.* from (' || v_from || $rows$
             and ev.ev_txid >= pg_snapshot_xmax(v_prev) and ev.ev_txid < pg_snapshot_xmax(v_cur)
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$
          union all
          select xe.* from unnest(v_xip) as xp(txid) cross join lateral ($rows$ || v_from || $rows$
             and ev.ev_txid = xp.txid
             and ev.ev_id > coalesce(st.st_acked_to, -1)$rows$ || v_mine || $rows$
           order by ev.ev_id limit i_max + 1) xe
           where cardinality(v_xip) > 1) u
           order by u.ev_id
           limit i_max + 1)$rows$;
    -- The same rows within a window of ev_ids that ends at v_lim: how a
    -- chunk of a large batch is read (see the loop below). Put in at
    -- <wrows>: statements of their own, so that their plans are never the
    -- plans of the ones above, and the batch's two parts (the ev_txid
    -- range, the previous tick's running transactions) apart, so that the
    -- planner does not trade the leading ev_txid for the window (it would
    -- scan the whole index): each part is an index range on
    -- (ev_txid, ev_id), ev_id tested within the index. An index range
    -- scans every entry of its xids, so a short range (at most 256 xids: a
    -- large transaction that committed between two ticks, the ticker
    -- running) goes to the list (v_txids: the running transactions, and
    -- the range's, that committed by the batch's end), where each xid is a
    -- seek to the window's start: the window then reads no entry outside
    -- it. No xid is in both parts.
    v_wrows constant text := '(select u.* from (' || v_from || $wrows$
             and ev.ev_txid >= v_txlo and ev.ev_txid < v_txhi
             and ev.ev_id > st.st_acked_to and ev.ev_id <= v_lim$wrows$ || v_mine || $wrows$
          union all
          $wrows$ || v_from || $wrows$
             and cardinality(v_txids) > 1 and ev.ev_txid = any(v_txids)
             and ev.ev_id > st.st_acked_to and ev.ev_id <= v_lim$wrows$ || v_mine || $wrows$) u
           order by u.ev_id
           limit i_max + 1)$wrows$;
    -- How a chunk is read and returned, written once and put in twice
    -- (at <read rows> and <read wrows>): over <rows>, and over <wrows>.
    v_read constant text := $read$        perform set_config('pgque.chunk_end', '', true);
        return query
        select x.ev_id, st.st_batch, x.ev_type, x.ev_data, coalesce(x.ev_retry, 0), x.ev_time,
               x.ev_extra1, x.ev_extra2, x.ev_extra3, x.ev_extra4/*<epoch>*/
          from (select e.*,
                       row_number() over w as rn,
                       count(*) over w as cnt,
                       sum(octet_length(e.ev_data)) over w as bytes
                  from /*<rows>*/ e
                window w as (order by e.ev_id rows between unbounded preceding and unbounded following)) x
         where x.rn <= i_max
           and case when coalesce(x.bytes, 0) > v_budget
                    then x.rn = 1 and set_config('pgque.chunk_end', 'over', true) is null
                    else x.rn < least(x.cnt, i_max)
                         or (x.rn = least(x.cnt, i_max)
                             and set_config('pgque.chunk_end', x.ev_id::text || case when x.cnt <= i_max then ' all' else ' more' end,
                                            true) is not null)
               end
         order by x.ev_id;
        if not found and current_setting('pgque.chunk_end') = 'over' then
            -- More bytes than the budget in the next max+1 events: cut the
            -- chunk by a running sum, the last row within the budget (at
            -- least one row) looking at the size of the next.
            return query
            select x.ev_id, st.st_batch, x.ev_type, x.ev_data, coalesce(x.ev_retry, 0), x.ev_time,
                   x.ev_extra1, x.ev_extra2, x.ev_extra3, x.ev_extra4/*<epoch>*/
              from (select e.*,
                           row_number() over w as rn,
                           sum(octet_length(e.ev_data)) over w as run,
                           lead(e.ev_id) over w as nxt,
                           lead(octet_length(e.ev_data)) over w as nxt_len
                      from /*<rows>*/ e
                    window w as (order by e.ev_id rows unbounded preceding)) x
             where x.rn <= i_max and (x.rn = 1 or coalesce(x.run, 0) <= v_budget)
               and (not (x.rn <= i_max and (x.rn = 1 or coalesce(x.run, 0) <= v_budget)
                         and (x.rn = i_max or x.nxt is null or coalesce(x.run, 0) + coalesce(x.nxt_len, 0) > v_budget))
                    or set_config('pgque.chunk_end', x.ev_id::text || case when x.nxt is null then ' all' else ' more' end,
                                  true) is not null)
             order by x.ev_id;
        end if;
$read$;
    v_body constant text := replace(replace(replace(replace($body$
#variable_conflict use_column
declare
/*<declare>*/    v_sub    integer;
    v_queue  integer;
    st       pgque.sub_state;
    v_dirty  boolean := false;
    v_next   bigint;
    v_prev   pg_snapshot;
    v_cur    pg_snapshot;
    v_xip    xid8[];
    v_empty  integer := 0;
    v_budget bigint := pgque._chunk_bytes();
    v_end    text;
    v_last   bigint;
    v_all    boolean;
    v_lim    bigint;
    v_width  bigint;
    v_seq    bigint;
    v_span   bigint;
    v_txlo   xid8;
    v_txhi   xid8;
    v_txids  xid8[];
    v_reader text;
begin
/*<entry>*/    if i_max is null then
        raise exception using errcode = '22004', message = 'max must not be NULL';
    end if;
    if i_max < 1 or i_max > 100000 then
        raise exception using errcode = 'PQ011', message = format('max must be between 1 and 100000, not %s', i_max);
    end if;
    select s1.sub_id, s1.sub_queue into v_sub, v_queue
      from pgque.subscription s1 join pgque.queue q on q.queue_id = s1.sub_queue
     where q.queue_name = i_queue and s1.sub_name = i_sub;
    if not found then
        perform pgque._subscription(i_queue, i_sub); -- raises the right error
    end if;
    if i_ack_batch is null then
        -- A poll with nothing to do reads and locks nothing more.
        st := pgque._sub_state(v_sub);
        if st.st_batch is null and not exists (
            select 1 from pgque.tick t where t.tick_queue = v_queue and t.tick_id > st.st_last_tick) then
/*<done>*/            return;
        end if;
    end if;
    st := pgque._lock_sub(v_sub);
    if i_ack_batch is not null then
        if st.st_batch is distinct from i_ack_batch then
            raise exception using errcode = 'PQ020',
                message = format('batch %s is not open for consumer %L of queue %L', i_ack_batch, i_sub, i_queue);
        end if;
        if st.st_delivered_to is not null then
            if st.st_delivered_all then
                st.st_last_tick := st.st_next_tick;
                st.st_next_tick := null;
                st.st_batch := null;
                st.st_acked_to := null;
            else
                st.st_acked_to := st.st_delivered_to;
            end if;
            st.st_delivered_to := null;
            st.st_delivered_all := false;
            v_dirty := true;
        end if;
    end if;
    loop
        if st.st_batch is null then
            -- A sealed subscription (an online resize) ends at its seal;
            -- read under the lock, so a seal committed meanwhile counts.
            v_next := pgque._batch_end(v_queue, st.st_last_tick, i_span,
                                       (select s2.sub_until_tick from pgque.subscription s2 where s2.sub_id = v_sub));
            if v_next is null then
                exit;
            end if;
            st.st_next_tick := v_next;
            st.st_batch := nextval('pgque.batch_id_seq') * 1048576 + v_sub;
            st.st_acked_to := null;
            st.st_delivered_to := null;
            st.st_delivered_all := false;
            v_dirty := true;
        end if;
        -- Both ticks of the batch in one statement (a flip may hold a tick
        -- in both generations for a moment: any copy will do), and the
        -- events sent between them (the size estimate the reader's choice
        -- below goes by).
        select p.tick_snapshot, c.tick_snapshot, c.tick_event_seq - p.tick_event_seq
          into v_prev, v_cur, v_span
          from (select t.tick_snapshot, t.tick_event_seq from pgque.tick t
                 where t.tick_queue = v_queue and t.tick_id = st.st_last_tick limit 1) p,
               (select t.tick_snapshot, t.tick_event_seq from pgque.tick t
                 where t.tick_queue = v_queue and t.tick_id = st.st_next_tick limit 1) c;
        if v_prev is null or v_cur is null then
            raise exception using errcode = 'XX000',
                message = format('ticks %s/%s of batch %s are missing', st.st_last_tick, st.st_next_tick, st.st_batch);
        end if;
        -- The running transactions, and 0 (no transaction's id): a list
        -- the planner cannot prove empty. "ev_txid = any('{}')" is a
        -- condition it proves false, and a false condition implies any
        -- partial index's predicate, so it may read that part from the
        -- dedup key index: every event with a key in the table. When 0 is
        -- all there is (no transaction was running: the common case),
        -- "cardinality(v_xip) > 1" folds to false in the custom plan and
        -- drops that scan before it is planned (and so for v_txids).
        v_xip := array(select pg_snapshot_xip(v_prev)) || '0'::xid8;
        -- The batch's next max+1 rows past the acknowledged ones (<rows>,
        -- above), returned in ev_id order up to max. One window over that set, whole, gives
        -- each row its number, and every row the set's count and bytes:
        -- the row after the chunk (number max+1) says whether the chunk
        -- reaches the batch's end, and the chunk's last row notes its ev_id
        -- and that fact in the transaction-local setting pgque.chunk_end
        -- as it goes out, so the rows are read, cut and returned by one
        -- plan-cached statement with no second pass (a CTE to count them
        -- costs about as much as the read itself). A running sum per row,
        -- or lead() to look at the next one, would cost a fifth more
        -- server time per event; the byte budget only needs them when the
        -- set's bytes pass it, and then this statement returns nothing,
        -- says so in the setting, and the one below cuts the chunk. The
        -- quals are complete on their own (each row's test implies it is
        -- in the chunk), whatever order the planner gives them; CASE fixes
        -- the order of the two tests.
        -- A large batch (see "Large batches" in docs/design.md): past its
        -- first chunk, the next chunk is looked for in a window of ev_ids
        -- after the acknowledged ones, whose rows the (ev_txid, ev_id)
        -- index yields without reading the batch's other rows, so every
        -- chunk costs its own rows and not the batch's remaining ones. The
        -- window stands only when it holds the next max+1 rows: its
        -- (max+1)th row's ev_id becomes v_lim, so the window's statements
        -- below return exactly the rows the unbounded ones would. A window
        -- that holds fewer grows fourfold, and once it would reach the
        -- batch's end tick's event sequence (no ev_id of the batch is
        -- past it), the unbounded statements read the chunk instead: the
        -- last chunk, and every chunk of a small batch. Rows of a slot
        -- are one in nslots of the window's.
        v_lim := null;
        if st.st_acked_to is not null then
            v_seq := (select t.tick_event_seq from pgque.tick t
                       where t.tick_queue = v_queue and t.tick_id = st.st_next_tick limit 1);
            v_width := (i_max + 1 + (i_max + 1) / 4) * greatest(coalesce(i_nslots, 1), 1);
            if st.st_acked_to + v_width < v_seq then
                v_txlo := pg_snapshot_xmax(v_prev);
                v_txhi := pg_snapshot_xmax(v_cur);
                if v_txhi::text::bigint - v_txlo::text::bigint <= 256 then
                    v_txids := array(select x from unnest(v_xip) x where pg_visible_in_snapshot(x, v_cur)
                                     union all
                                     select g::text::xid8
                                       from generate_series(v_txlo::text::bigint, v_txhi::text::bigint - 1) g
                                      where pg_visible_in_snapshot(g::text::xid8, v_cur));
                    v_txhi := v_txlo;
                else
                    v_txids := array(select x from unnest(v_xip) x where pg_visible_in_snapshot(x, v_cur));
                end if;
                while st.st_acked_to + v_width < v_seq loop
                    v_lim := st.st_acked_to + v_width;
                    v_lim := (select w.ev_id from /*<wrows>*/ w order by w.ev_id offset i_max limit 1);
                    exit when v_lim is not null;
                    v_width := v_width * 4;
                end loop;
            end if;
        end if;
        -- A chunk of up to about 256 events (by max, or by the events
        -- sent between the batch's ticks, a slot's share of them), the
        -- whole chunk read by one statement, goes through the queue's
        -- reader (see "Readers" above): the same statement, planned once
        -- per session instead of at every chunk. Larger chunks are read
        -- here: their plan costs less than handing their rows over from a
        -- second function. The estimate only picks the way; both read the
        -- same rows.
        if v_lim is null and v_reader is null then
            v_reader := '';
            if i_max <= 256 or v_span / greatest(coalesce(i_nslots, 1), 1) <= 256 then
                v_reader := format('_read_%s_%s', v_queue, coalesce(i_nslots, 1));
                if to_regproc('pgque.' || v_reader) is null then
                    v_reader := ''; -- not made yet (see _make_readers)
                else
                    v_reader := format('select r.*/*<epoch param>*/ from pgque.%I($1, $2, $3, $4, $5, $6, $7, $8) r',
                                       v_reader);
                end if;
            end if;
        end if;
        if v_lim is null and v_reader <> '' then
            return query execute v_reader using st, v_prev, v_cur, v_xip, v_sub, i_slot, i_max, v_budget/*<epoch>*/;
        elsif v_lim is null then
/*<read rows>*/        else
/*<read wrows>*/        end if;
        if found then
            v_end := current_setting('pgque.chunk_end');
            v_last := split_part(v_end, ' ', 1)::bigint;
            v_all := split_part(v_end, ' ', 2) = 'all';
            if st.st_delivered_to is distinct from v_last or st.st_delivered_all is distinct from v_all then
                st.st_delivered_to := v_last;
                st.st_delivered_all := v_all;
                v_dirty := true;
            end if;
            exit;
        end if;
        -- Nothing (left) for this consumer in the batch: finish it, go on.
        st.st_last_tick := st.st_next_tick;
        st.st_next_tick := null;
        st.st_batch := null;
        st.st_acked_to := null;
        st.st_delivered_to := null;
        st.st_delivered_all := false;
        v_dirty := true;
        v_empty := v_empty + 1;
        exit when v_empty >= 100;
    end loop;
    -- A redelivery of the same chunk writes nothing.
    if v_dirty then
        perform pgque._put_state(st);
    end if;
/*<done>*/end;
$body$, '/*<read rows>*/', v_read), '/*<read wrows>*/', replace(v_read, '/*<rows>*/', '/*<wrows>*/')),
        '/*<rows>*/', v_rows), '/*<wrows>*/', v_wrows);
    -- Without a lease: no epoch column, nothing to do when done.
    v_plain constant text := replace(replace(replace(v_body, '/*<epoch>*/', ''), '/*<epoch param>*/', ''), '/*<done>*/', '');
begin
    execute format($ddl$
create or replace function pgque._deliver_raw(i_queue text, i_sub text, i_max integer,
                                              i_slot integer, i_nslots integer, i_span bigint,
                                              i_ack_batch bigint default null)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as %L$ddl$, replace(replace(v_plain, '/*<declare>*/', ''), '/*<entry>*/', ''));

    execute format($ddl$
create or replace function pgque.receive_raw(i_queue text, i_consumer text, i_max integer default 100,
                                             i_ack_batch bigint default null)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as %L$ddl$, replace(replace(v_plain,
        '/*<declare>*/', $decl$    i_sub    text := i_consumer;
    i_slot   integer;
    i_nslots integer;
    i_span   bigint := i_max;
$decl$),
        '/*<entry>*/', $entry$    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._not_null('consumer name', i_consumer);
    perform pgque._refuse_slot(i_consumer);
$entry$));

    -- The body, markers in, for the partition layer's entry point
    -- (receive_partitioned_raw, in partition/functions/
    -- pgque.receive_partitioned.sql).
    execute format($ddl$
create or replace function pgque._deliver_raw_body()
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as %L$ddl$, 'select ' || quote_literal(v_body));

    -- What a reader runs (see below): the chunk read over <rows>, no epoch
    -- column; v_queue and i_nslots are put in as numbers by _make_reader.
    execute format($ddl$
create or replace function pgque._reader_src()
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as %L$ddl$, 'select ' || quote_literal(replace(replace(v_read, '/*<rows>*/', v_rrows), '/*<epoch>*/', '')));
end
$deliver_raw$;

-- Readers. The statement that reads a chunk names the queue's partitions
-- by a parameter (the queue id) and the routing expression by another (the
-- slot count), so a plan made for one call serves no other: a generic plan
-- would hold every queue's partitions and could use no routing index. The
-- entry points therefore plan it at every chunk, and for a chunk of a few
-- events that planning was most of the call (0.4 ms of about 0.8 ms per
-- receive_partitioned_raw). A reader, pgque._read_<queue id>_<N>, is the
-- same statement with the queue id and N written in as numbers: plan-time
-- pruning keeps its partitions to the queue's own, N matches the routing
-- index, and its plan is made once per session (a generic plan, forced:
-- the custom plans would look cheaper, since they drop the running-xid
-- scan when no transaction ran, and cost a planning each). It plans
-- without sequential scans: a plan cached while a table is empty would
-- otherwise keep scanning it whole as it fills. The entry points call it
-- with EXECUTE, which plans only the call, and only for chunks of up to
-- 256 events (above, the rows cost more to hand over from a second
-- function than the plan costs). _make_reader makes one when a queue gets
-- its first consumer of that N (subscribe, subscribe_slot, resize_slots)
-- and the install remakes every existing one, so that a reader is always
-- the statement of the installed version; until one exists the entry
-- points read inline. Readers are not granted to any role.

-- _make_reader(queue_id, nslots, replace): creates the queue's reader for
-- nslots (1 for plain consumers), or replaces it when replace is true. Two
-- sessions making the same reader at once: the second finds it made. The
-- SQL text holds only the two integers and the template.
create or replace function pgque._make_reader(i_queue_id integer, i_nslots integer, i_replace boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_name text := format('_read_%s_%s', i_queue_id, i_nslots);
begin
    if i_queue_id is null or i_nslots is null or i_nslots < 1 then
        raise exception using errcode = '22023', message = format('no reader for queue %s and %s slots', i_queue_id, i_nslots);
    end if;
    if not i_replace and to_regproc('pgque.' || v_name) is not null then
        return;
    end if;
    begin
        execute format($ddl$
create or replace function pgque.%I(st pgque.sub_state, v_prev pg_catalog.pg_snapshot, v_cur pg_catalog.pg_snapshot,
                                    v_xip pg_catalog.xid8[], v_sub integer, i_slot integer, i_max integer,
                                    v_budget bigint)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as %L$ddl$,
            v_name,
            E'\n#variable_conflict use_column\nbegin\n'
                || replace(replace(pgque._reader_src(), 'v_queue', i_queue_id::text), 'i_nslots', i_nslots::text)
                || E'end;\n');
    exception when unique_violation then
        return; -- made by a concurrent session
    end;
    execute format('revoke all on function pgque.%I(pgque.sub_state, pg_catalog.pg_snapshot, pg_catalog.pg_snapshot, '
                   'pg_catalog.xid8[], integer, integer, integer, bigint) from public', v_name);
end;
$$;

-- _readers(): the readers that exist: function, queue id, N.
create or replace function pgque._readers()
returns table (fn regprocedure, queue_id integer, nslots integer) language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select p.oid::regprocedure, m[1]::integer, m[2]::integer
      from pg_catalog.pg_proc p
      cross join lateral pg_catalog.regexp_match(p.proname, '^_read_([0-9]+)_([0-9]+)$') m
     where p.pronamespace = 'pgque'::regnamespace and m is not null
$$;

-- _maint_readers(): drops the readers of queues that no longer exist (a
-- 'maint' hook). Returns how many it dropped.
create or replace function pgque._maint_readers()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r   record;
    v_n integer := 0;
begin
    for r in
        select x.fn from pgque._readers() x
         where not exists (select 1 from pgque.queue q where q.queue_id = x.queue_id)
    loop
        execute format('drop function if exists %s', r.fn);
        v_n := v_n + 1;
    end loop;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'readers', 'pgque._maint_readers()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- Every reader of the install is made again from this version's statement.
select pgque._make_reader(x.queue_id, x.nslots, true)
  from (select queue_id, 1 as nslots from pgque.queue
        union
        select r.queue_id, r.nslots from pgque._readers() r
         where exists (select 1 from pgque.queue q where q.queue_id = r.queue_id)) x;

-- _as_messages(queue, subscription, max, slot, nslots, span): the chunk
-- _deliver_raw hands out, with payloads as jsonb, for the functions whose
-- contract is jsonb (receive, receive_partitioned). Data that jsonb cannot
-- hold (only insert_event can store it: text that is not JSON, a \u0000
-- escape, a number out of range, nesting past the stack limit) comes as a
-- JSON string of the stored text: the chunk is then read again, and its
-- state appended again, in place of the failed attempt (one subtransaction
-- per chunk, none per row). The chunk is collected before it is returned,
-- so a failed attempt returns nothing.
create or replace function pgque._as_messages(i_queue text, i_sub text, i_max integer,
                                              i_slot integer, i_nslots integer, i_span bigint)
returns pgque.message[] language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_rows pgque.message[];
begin
    begin
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, d.payload::jsonb, d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._deliver_raw(i_queue, i_sub, i_max, i_slot, i_nslots, i_span) d);
    exception when data_exception or program_limit_exceeded then
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, pgque._payload(d.payload), d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._deliver_raw(i_queue, i_sub, i_max, i_slot, i_nslots, i_span) d);
    end;
    return v_rows;
end;
$$;


-- ==== api/functions/pgque.receive.sql ====
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
-- Defined in api/functions/pgque.deliver_raw.sql, from _deliver_raw's
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
     where s.sub_id = (i_batch_id % 1048576)::integer;
    return pgque._ack(i_batch_id, null);
end;
$$;

-- nack(batch_id, msg_id, retry_after, reason): redeliver one received event
-- to this consumer only after retry_after, or dead-letter it once it has
-- been retried max_retries times (the reason is kept with it). Returns 1
-- when retried, 0 when dead-lettered. The chunk must still be acked.
create or replace function pgque.nack(i_batch_id bigint, i_msg_id bigint, i_retry_after interval,
                                      i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize_batch(i_batch_id, 'consume'); -- access check
    perform pgque._refuse_slot((pgque._batch(i_batch_id)).sub_name);
    return pgque._event_retry(i_batch_id, i_msg_id, i_retry_after, i_reason);
end;
$$;


-- ==== api/grants.sql ====
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
    pgque.receive(text, text, integer),
    pgque.receive_raw(text, text, integer, bigint),
    pgque.ack(bigint),
    pgque.nack(bigint, bigint, interval, text)
    to pgque_reader, pgque_admin;

-- Table attachment: attach_table/detach_table run as their caller (who
-- needs the TRIGGER privilege on the table); the definer helpers they call
-- are granted with them.
grant execute on function
    pgque.attach_table(text, regclass, text, text[], text[], text[], text, boolean),
    pgque.detach_table(text, regclass),
    pgque.attached_tables(),
    pgque._table_source_define(text, regclass, text, text[], text[], text[], text, boolean),
    pgque._table_source_trigger_name(text),
    pgque._table_source_forget(text, regclass)
    to pgque_admin;

select pgque._grant_select(array['pgque.dedup_state', 'pgque.table_source']::regclass[],
    array['pgque_admin']::regrole[]);


-- ==== partition/structure/tables.sql ====
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

-- key_block: under the pause policy, one row per blocked key of a slot
-- (never per healthy event). State "blocked": kb_head failed and awaits its
-- retry; every other event of the key is deferred. State "releasing": the
-- deferred events were put back (up to kb_wait) and are being delivered in
-- ev_id order; newer events of the key are still deferred. The state
-- resolves when the event kb_wait, handed out in batch kb_wait_batch, is
-- acknowledged (or the head is dead-lettered). kb_kid is the key with NULL
-- spelled distinctly ('n' for NULL, 'k' || key otherwise); it is also the
-- deferral group.
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


-- ==== partition/structure/presence.sql ====
-- Worker presence: which worker processes of a partitioned consumer are
-- alive, which slots they work, and whether they want more ("hungry").
--
-- Pools used to tell each other this by NOTIFY alone, but any role of the
-- cluster may LISTEN (reading queue names and worker ids) and NOTIFY
-- (forging hungry workers, so real pools give slots up). Presence is
-- therefore kept here, written and read only through announce_worker;
-- NOTIFY on the presence channel is a wake-up hint whose payload nobody
-- trusts.
--
-- Every pool announces itself once per claim pass (about once a second), so
-- presence is written as often as anything in pgque. It is kept like the
-- subscription state (engine/structure/state.sql): records are only ever
-- INSERTed, into two generations of a table list-partitioned by wp_gen; a
-- worker's presence is its newest record. maint() (through the
-- 'presence_flip' layer hook) copies each worker's newest record heard from
-- in the last 10 minutes into the other generation and TRUNCATEs the
-- retired one. A held xmin horizon therefore leaves no dead row versions
-- behind, however long it is held, and the table holds about one maint
-- interval of announcements.

-- Installs before the append-only presence kept one row per worker,
-- updated in place. Presence is soft state (pools announce again within a
-- second), so the old table is dropped rather than migrated.
do $presence$
begin
    if exists (select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                where n.nspname = 'pgque' and c.relname = 'worker_presence' and c.relkind = 'r') then
        drop table pgque.worker_presence;
    end if;
end
$presence$;

-- The generation new records go to: presence_gen_seq's value modulo 2 (a
-- sequence changes in place, so moving it makes no row version).
create sequence if not exists pgque.presence_gen_seq;

-- presence_rotation: one row, never updated; a flip locks it so that two
-- maint() calls never flip presence at once.
create table if not exists pgque.presence_rotation (
    singleton boolean primary key default true check (singleton)
);
insert into pgque.presence_rotation default values on conflict do nothing;

-- _presence_gen(): the generation new presence records go to (inlined
-- into the INSERT, as _gen is: no SET clause, volatile, every name
-- qualified).
create or replace function pgque._presence_gen()
returns integer language sql volatile
as $$
    select (coalesce(pg_catalog.pg_sequence_last_value('pgque.presence_gen_seq'::pg_catalog.regclass), 0)
            operator(pg_catalog.%) 2)::integer
$$;

--   wp_queue, wp_consumer, wp_worker  who (queue id, consumer name, worker id)
--   wp_hungry   the worker wants more slots
--   wp_slots    the slots it works
--   wp_seen     when it announced itself (clock_timestamp)
--   wp_gen      the generation (partition) the record lives in
create table if not exists pgque.worker_presence (
    wp_queue    integer not null,
    wp_consumer text not null,
    wp_worker   text not null,
    wp_hungry   boolean not null,
    wp_slots    integer[] not null,
    wp_seen     timestamptz not null,
    wp_gen      integer not null default pgque._presence_gen()
) partition by list (wp_gen);
create table if not exists pgque.worker_presence_0 partition of pgque.worker_presence for values in (0);
create table if not exists pgque.worker_presence_1 partition of pgque.worker_presence for values in (1);
-- Serves both "the next worker after w" (the skip scan in announce_worker)
-- and "w's newest record".
select pgque._create_index('worker_presence_worker_idx', $ddl$create index worker_presence_worker_idx
    on pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_seen desc)$ddl$);


-- ==== partition/structure/key_hold.sql ====
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


-- ==== partition/structure/resize.sql ====
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


-- ==== partition/functions/pgque.slot_subscribe.sql ====
-- Slots.
--
-- Slot k of N for consumer c is its own engine subscription "c#k/N" with
-- its own cursor, so slots never lose each other's events. Slot k receives
-- exactly the events whose partition key hashes to k (NULL keys: slot 0),
-- through the engine's extra_where hook.

-- _check_slot(slot, nslots): validates slot numbers (PQ011, 22004).
create or replace function pgque._check_slot(i_slot integer, i_nslots integer)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_slot is null or i_nslots is null then
        raise exception using errcode = '22004', message = 'slot and nslots must not be NULL';
    end if;
    if i_nslots < 1 or i_nslots > 1024 then
        raise exception using errcode = 'PQ011', message = format('nslots must be between 1 and 1024, not %s', i_nslots);
    end if;
    if i_slot < 0 or i_slot >= i_nslots then
        raise exception using errcode = 'PQ011',
            message = format('slot must be between 0 and %s for %s slots, not %s', i_nslots - 1, i_nslots, i_slot);
    end if;
end;
$$;

-- _slot_name(consumer, slot, nslots): the slot's subscription name. This
-- and _slot_filter are inlined into their callers' expressions (no SET
-- clause, so the planner may; every name qualified): every receive and
-- ack computes them, and a SQL function that is not inlined is planned
-- again at each call.
create or replace function pgque._slot_name(i_consumer text, i_slot integer, i_nslots integer)
returns text language sql immutable
as $$ select i_consumer operator(pg_catalog.||) '#' operator(pg_catalog.||) i_slot::pg_catalog.text
             operator(pg_catalog.||) '/' operator(pg_catalog.||) i_nslots::pg_catalog.text $$;

-- _slot_filter(slot, nslots): the routing predicate for extra_where, built
-- from two validated integers only; NULL (no filter) when nslots is 1.
create or replace function pgque._slot_filter(i_slot integer, i_nslots integer)
returns text language sql stable
as $$
    select case when i_nslots operator(pg_catalog.=) 1 then null else
        pg_catalog.format('(case when ev_extra1 is null then 0 else (pg_catalog.hashtextextended(ev_extra1, 0) %% %s + %s) %% %s end) = %s',
                          i_nslots::integer, i_nslots::integer, i_nslots::integer, i_slot::integer)
    end
$$;

-- slot_of(key, nslots): the slot a partition key maps to (G1). Lets
-- operators and tests ask where a key goes. nslots is validated like
-- everywhere else (22004, PQ011).
create or replace function pgque.slot_of(i_key text, i_nslots integer)
returns integer language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_nslots is null then
        raise exception using errcode = '22004', message = 'nslots must not be NULL';
    end if;
    if i_nslots < 1 or i_nslots > 1024 then
        raise exception using errcode = 'PQ011', message = format('nslots must be between 1 and 1024, not %s', i_nslots);
    end if;
    return case when i_key is null then 0
                else ((hashtextextended(i_key, 0) % i_nslots + i_nslots) % i_nslots)::integer end;
end;
$$;

-- _slot_group(queue_id, consumer, nslots): checks N against the persisted
-- one, raising PQ030 on a mismatch and PQ034 when none is persisted.
create or replace function pgque._slot_group(i_queue text, i_consumer text, i_nslots integer)
returns pgque.slot_group language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    g pgque.slot_group;
begin
    select g1.* into g from pgque.slot_group g1 join pgque.queue q on q.queue_id = g1.sg_queue
     where q.queue_name = i_queue and g1.sg_consumer = i_consumer;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    if g.sg_nslots <> i_nslots then
        raise exception using errcode = 'PQ030',
            message = format('consumer %L on queue %L has %s slots, not %s', i_consumer, i_queue, g.sg_nslots, i_nslots);
    end if;
    return g;
end;
$$;

-- _route_index(queue_id, nslots, wanted): creates (or drops, when no slot
-- group of the queue uses nslots any more) an index per event table on the
-- routing expression for nslots, ev_txid and ev_id. With it, slot k reads only
-- its own events instead of the whole stream: N slots cost about one
-- reader, not N. The expression is spelled exactly as _slot_filter spells
-- it, so the planner matches the predicate to the index.
--
-- Building an index blocks the table's producers while it runs, and every
-- index slows every insert. So a queue has at most 4 distinct N with an
-- index (PQ051 beyond), and an index is built now only on a table that is
-- nearly empty and whose lock is granted within 100 ms; the other tables
-- get it from maint_route_indexes once rotation has emptied them. Until
-- then their slots read them through a filter (correct, only slower).
create or replace function pgque._route_index(i_queue_id integer, i_nslots integer, i_wanted boolean)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q   pgque.queue;
    v_n integer;
    v_ix text;
    v_distinct integer;
    v_old_lt text := current_setting('lock_timeout');
    v_big boolean;
begin
    if i_nslots < 2 then
        return;
    end if;
    if not i_wanted and exists (select 1 from pgque.slot_group where sg_queue = i_queue_id
                                   and (sg_nslots = i_nslots or sg_resize_to = i_nslots)) then
        return;
    end if;
    if i_wanted then
        -- A resize in progress uses both its N.
        select count(distinct n) into v_distinct
          from (select sg_nslots from pgque.slot_group where sg_queue = i_queue_id
                union all
                select sg_resize_to from pgque.slot_group where sg_queue = i_queue_id) x(n)
         where n >= 2;
        if v_distinct > 4 then
            raise exception using errcode = 'PQ051',
                message = format('queue %s already has consumers with 4 different slot counts (N >= 2); '
                                 'use one of the N in use or remove a consumer first', (select queue_name from pgque.queue where queue_id = i_queue_id)),
                hint = 'every distinct N adds a routing index on each event table, which every producer maintains';
        end if;
    end if;
    select * into q from pgque.queue where queue_id = i_queue_id;
    for v_n in 0 .. q.queue_ntables - 1 loop
        v_ix := 'event_' || i_queue_id || '_' || v_n || '_route' || i_nslots;
        if i_wanted then
            execute format('select count(*) > 1000 from (select 1 from %s limit 1001) x', pgque._event_table(i_queue_id, v_n))
               into v_big;
            continue when v_big;
            begin
                perform set_config('lock_timeout', '100ms', true);
                perform pgque._route_index_build(i_queue_id, v_n, i_nslots);
                perform set_config('lock_timeout', v_old_lt, true);
            exception when lock_not_available then
                perform set_config('lock_timeout', v_old_lt, true);
            end;
        else
            execute format('drop index if exists pgque.%I', v_ix);
        end if;
    end loop;
end;
$$;

-- _route_index_build(queue_id, table, nslots): creates one routing index,
-- ((routing expression), ev_txid, ev_id): ev_id lets a slot's chunk of a
-- large batch be read from the index alone ("Large batches" in
-- docs/design.md). An index of an earlier version, without ev_id, is
-- dropped and built again.
create or replace function pgque._route_index_build(i_queue_id integer, i_table integer, i_nslots integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_ix text := 'event_' || i_queue_id || '_' || i_table || '_route' || i_nslots;
begin
    if pgque._route_index_old(v_ix) then
        execute format('drop index pgque.%I', v_ix);
    end if;
    execute format('create index if not exists %I on %s ((%s), ev_txid, ev_id)',
                   v_ix,
                   pgque._event_table(i_queue_id, i_table),
                   regexp_replace(pgque._slot_filter(0, i_nslots), ' = 0$', ''));
end;
$$;

-- _route_index_old(index): whether the routing index exists without
-- ev_id (made by an earlier version).
create or replace function pgque._route_index_old(i_index text)
returns boolean language sql stable
set search_path = pg_catalog, pg_temp
as $$
    select coalesce((select i.indnatts < 3 from pg_catalog.pg_index i
                      where i.indexrelid = pg_catalog.to_regclass(pg_catalog.format('pgque.%I', i_index))), false)
$$;

-- maint_route_indexes(): builds the routing indexes _route_index had to
-- leave out (a table too full, or its lock not granted at once), on the
-- tables where building is cheap now: at most 1000 rows, which rotation
-- guarantees sooner or later, lock granted within 100 ms, and drops those
-- of an N no group uses any more. The ticker daemon calls it after every
-- maint(). Returns how many indexes it built or dropped.
-- Tables: slot_group (read), event tables (index).
create or replace function pgque.maint_route_indexes()
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    r    record;
    v_big boolean;
    v_n  integer := 0;
    v_old_lt text := current_setting('lock_timeout');
begin
    for r in
        select g.sg_queue as queue_id, t.n, g.sg_nslots as nslots
          from (select distinct sg_queue, n as sg_nslots
                  from pgque.slot_group cross join lateral (values (sg_nslots), (sg_resize_to)) v(n)
                 where n >= 2) g
          join pgque.queue q on q.queue_id = g.sg_queue
          cross join lateral generate_series(0, q.queue_ntables - 1) t(n)
         where pg_catalog.to_regclass(pg_catalog.format('pgque.%I', 'event_' || g.sg_queue || '_' || t.n || '_route' || g.sg_nslots)) is null
            or pgque._route_index_old('event_' || g.sg_queue || '_' || t.n || '_route' || g.sg_nslots)
         order by 1, 2, 3
    loop
        execute format('select count(*) > 1000 from (select 1 from %s limit 1001) x', pgque._event_table(r.queue_id, r.n))
           into v_big;
        continue when v_big;
        begin
            perform set_config('lock_timeout', '100ms', true);
            perform pgque._route_index_build(r.queue_id, r.n, r.nslots);
            perform set_config('lock_timeout', v_old_lt, true);
            v_n := v_n + 1;
        exception when lock_not_available then
            perform set_config('lock_timeout', v_old_lt, true);
        end;
    end loop;
    -- Routing indexes of an N no slot group uses any more (the old N of a
    -- completed resize): dropped here rather than in the cutover, because
    -- the drop needs the table's exclusive lock, waited for at most 100 ms.
    for r in
        select c.relname, m[1]::integer as queue_id, m[3]::integer as nslots
          from pg_catalog.pg_class c
          join pg_catalog.pg_namespace ns on ns.oid = c.relnamespace and ns.nspname = 'pgque'
          cross join lateral pg_catalog.regexp_match(c.relname, '^event_([0-9]+)_([0-9]+)_route([0-9]+)$') m
         where c.relkind = 'i' and m is not null
    loop
        continue when exists (select 1 from pgque.slot_group g where g.sg_queue = r.queue_id
                                 and (g.sg_nslots = r.nslots or g.sg_resize_to = r.nslots));
        begin
            perform set_config('lock_timeout', '100ms', true);
            execute format('drop index if exists pgque.%I', r.relname);
            perform set_config('lock_timeout', v_old_lt, true);
            v_n := v_n + 1;
        exception when lock_not_available then
            perform set_config('lock_timeout', v_old_lt, true);
        end;
    end loop;
    return v_n;
end;
$$;

-- subscribe_slot(queue, consumer, slot, nslots, policy): subscribes one
-- slot, setting the failure policy ('skip' or 'pause') when the consumer's
-- first slot is created; NULL keeps the persisted one (skip by default). A different
-- policy for an existing consumer raises PQ031: use set_failure_policy.
create or replace function pgque.subscribe_slot(i_queue text, i_consumer text, i_slot integer, i_nslots integer,
                                                i_policy text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue := pgque._queue(i_queue);
    g     pgque.slot_group;
    v_new integer;
    v_sub integer;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_consumer(i_consumer);
    perform pgque._check_slot(i_slot, i_nslots);
    if i_policy is not null and i_policy not in ('skip', 'pause') then
        raise exception using errcode = 'PQ011',
            message = format('failure policy must be ''skip'' or ''pause'', not %L', i_policy);
    end if;
    insert into pgque.slot_group (sg_queue, sg_consumer, sg_nslots, sg_policy)
    values (q.queue_id, i_consumer, i_nslots, coalesce(i_policy, 'skip'))
    on conflict do nothing;
    if found then
        perform pgque._make_reader(q.queue_id, i_nslots, false); -- see api/functions/pgque.deliver_raw.sql
        perform pgque._route_index(q.queue_id, i_nslots, true);
    end if;
    perform 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer for update;
    g := pgque._slot_group(i_queue, i_consumer, i_nslots);
    if i_policy is not null and g.sg_policy <> i_policy then
        raise exception using errcode = 'PQ031',
            message = format('consumer %L on queue %L has failure policy %s, not %s; use set_failure_policy',
                             i_consumer, i_queue, g.sg_policy, i_policy);
    end if;

    v_new := pgque.register_consumer(i_queue, pgque._slot_name(i_consumer, i_slot, i_nslots));
    select sub_id into v_sub from pgque.subscription
     where sub_queue = q.queue_id and sub_name = pgque._slot_name(i_consumer, i_slot, i_nslots);
    insert into pgque.slot_lease (sl_queue, sl_consumer, sl_slot, sl_sub)
    values (q.queue_id, i_consumer, i_slot, v_sub)
    on conflict do nothing;
    return v_new;
end;
$$;

-- subscribe_slot(queue, consumer, slot, nslots): subscribes one slot.
-- Persists N for (queue, consumer) with the first slot; another N raises
-- PQ030. Idempotent. Returns 1 when the slot is new, 0 when it existed.
create or replace function pgque.subscribe_slot(i_queue text, i_consumer text, i_slot integer, i_nslots integer)
returns integer language sql security definer
set search_path = pg_catalog, pg_temp
as $$ select pgque.subscribe_slot(i_queue, i_consumer, i_slot, i_nslots, null) $$;

-- unsubscribe_slot(queue, consumer, slot, nslots): removes one slot with
-- its subscription, lease, open batch and retries. When the last slot goes,
-- N is released. Returns 1 when removed, 0 when it was not subscribed.
create or replace function pgque.unsubscribe_slot(i_queue text, i_consumer text, i_slot integer, i_nslots integer)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_consumer(i_consumer);
    perform pgque._check_slot(i_slot, i_nslots);
    perform 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer for update;
    if not found then
        return 0;
    end if;
    perform pgque._slot_group(i_queue, i_consumer, i_nslots);
    if exists (select 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer
                                                 and sg_resize_to is not null) then
        raise exception using errcode = 'PQ073',
            message = format('consumer %L on queue %L is being resized; unsubscribe once the resize completed',
                             i_consumer, i_queue);
    end if;
    delete from pgque.subscription
     where sub_queue = q.queue_id and sub_name = pgque._slot_name(i_consumer, i_slot, i_nslots);
    if not found then
        return 0;
    end if;
    delete from pgque.slot_group g
     where g.sg_queue = q.queue_id and g.sg_consumer = i_consumer
       and not exists (select 1 from pgque.slot_lease l
                        where l.sl_queue = g.sg_queue and l.sl_consumer = g.sg_consumer);
    if found then
        perform pgque._route_index(q.queue_id, i_nslots, false);
    end if;
    return 1;
end;
$$;


-- ==== partition/functions/pgque.slot_lease.sql ====
-- Leases.
--
-- Renewals write no row version: the lease row (owner, epoch, ttl, the
-- expiry set by the claim) changes only when the owner changes. A lease is
-- live until _lease_until: the later of that expiry and the time of the
-- slot subscription's newest state record plus the ttl. Every state change
-- of the slot is made by its owner, so consuming renews the lease, and a
-- renewal with nothing else to write appends a copy of the state
-- (_touch_state): an append, reclaimed by the state flips. Records older
-- than a claim are older than the expiry the claim set, so they never
-- extend a new owner's lease.
--
-- A slot is worked by the worker that holds its lease. claim_slot takes a
-- free or expired lease (epoch + 1, a new secret token) or renews one the
-- caller proves it holds (same epoch). Every receive/ack/nack on a slot
-- first checks, under the lease row's lock, that the caller presents the
-- lease's token: a worker whose lease was taken over, or anyone who merely
-- knows the owner's worker id, gets PQ085 and can neither receive nor ack.
-- An expired lease that nobody took over still belongs to its owner, whose
-- token still proves it (grace rule), so a slow but
-- sole worker is not fenced for nothing. Leases are plain short
-- transactions: they work through transaction-mode poolers. Times come
-- from clock_timestamp(), not the transaction start.

-- _check_worker(worker): validates a worker id.
create or replace function pgque._check_worker(i_worker text)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_worker is null then
        raise exception using errcode = '22004', message = 'worker id must not be NULL';
    end if;
    if i_worker = '' or octet_length(i_worker) > 200 then
        raise exception using errcode = 'PQ011',
            message = format('worker id must be 1 to 200 bytes, not %s', octet_length(i_worker));
    end if;
end;
$$;

-- _lease(queue, consumer, slot): the slot's lease row, locked. PQ034 when
-- the slot is not subscribed; a NULL slot (22004) or one outside 0..N-1 of
-- the persisted N (PQ011) is an invalid argument, not a missing slot.
-- The owner's calls hold the lock for a moment only, so the wait for it is
-- bounded: a transaction that keeps the row locked (it can only be an
-- owner's, or a successful claim's, left open) makes the others fail after
-- 2 seconds with 55P03 (lock_not_available), which is retryable.
create or replace function pgque._lease(i_queue text, i_consumer text, i_slot integer)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
set lock_timeout = '2s'
as $$
declare
    l pgque.slot_lease;
begin
    select l1.* into l from pgque.slot_lease l1 join pgque.queue q on q.queue_id = l1.sl_queue
     where q.queue_name = i_queue and l1.sl_consumer = i_consumer and l1.sl_slot = i_slot
       for update of l1;
    if not found then
        perform pgque._queue(i_queue);
        perform pgque._check_slot(i_slot, coalesce(
            (select g.sg_nslots from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
              where q.queue_name = i_queue and g.sg_consumer = i_consumer), 1024));
        raise exception using errcode = 'PQ034',
            message = format('slot %s of consumer %L on queue %L is not subscribed', i_slot, i_consumer, i_queue);
    end if;
    return l;
end;
$$;

-- _lease_until(lease): when the lease expires (see the header).
create or replace function pgque._lease_until(l pgque.slot_lease)
returns timestamptz language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_last timestamptz;
begin
    select st_time into v_last from pgque.sub_state where st_sub = l.sl_sub order by st_seq desc limit 1;
    return greatest(l.sl_until, v_last + l.sl_ttl);
end;
$$;

-- _lease_ttl(ttl, now): the ttl as the real duration it has from now
-- (intervals compare a month as 30 days, so '10000 years -3599999 days'
-- would otherwise pass a 1-day cap), checked to be positive and at most one
-- day (PQ011).
create or replace function pgque._lease_ttl(i_ttl interval, i_now timestamptz)
returns interval language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_real interval;
begin
    if i_ttl is not null then
        v_real := (i_now + i_ttl) - i_now;
    end if;
    if v_real is null or i_now + i_ttl <= i_now or i_now + i_ttl > i_now + interval '1 day' then
        raise exception using errcode = 'PQ011',
            message = format('lease ttl must be positive and at most 1 day, not %s', coalesce(i_ttl::text, 'NULL'));
    end if;
    return v_real;
end;
$$;

-- Lease tokens. The worker id is a display name: it is visible in the
-- lease views, in presence and in messages, so it proves nothing. The claim
-- that takes a lease returns a fresh random token (gen_random_uuid, 122
-- random bits) to the caller alone and stores only its SHA-256 in the lease
-- row; every call that acts as the holder presents (worker, token) and
-- _lease_proved checks it. A new owner gets a new token, so an earlier
-- owner's token is refused after a takeover.

-- Forms without a token.
drop function if exists pgque.claim_slot(text, text, integer, text, interval);
drop function if exists pgque.release_slot(text, text, integer, text);
drop function if exists pgque._hold_lease(text, text, integer, integer, text);

-- _token_hash(token): what the lease row stores of a token.
create or replace function pgque._token_hash(i_token uuid)
returns bytea language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    return sha256(uuid_send(i_token));
end;
$$;

-- _lease_proved(lease, worker, token): whether (worker, token) proves the
-- lease: the lease has an owner, it is worker, and token hashes to the
-- stored hash. A lease left from before tokens (no hash) proves nothing
-- until it is claimed again.
create or replace function pgque._lease_proved(l pgque.slot_lease, i_worker text, i_token uuid)
returns boolean language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    return coalesce(l.sl_owner = i_worker and l.sl_token = pgque._token_hash(i_token), false);
end;
$$;

-- _check_token(token): a NULL token is a missing argument (22004).
create or replace function pgque._check_token(i_token uuid)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_token is null then
        raise exception using errcode = '22004', message = 'lease token must not be NULL';
    end if;
end;
$$;

-- claim_slot(queue, consumer, slot, worker, ttl, token): takes the slot's
-- lease for worker, or renews it. Returns (epoch, token): a free or expired
-- lease is taken with epoch + 1 and a new token, which only this answer
-- ever carries (keep it secret: it is the lease's credential); a lease that
-- (worker, token) proves is renewed with the same epoch and token, even
-- after it expired if nobody took it over. Returns (NULL, NULL) when
-- another live lease holds the slot, including one held under worker's own
-- id that token does not prove. A refused claim holds no lock on the lease
-- row afterwards (the lock is taken in a subtransaction that is rolled
-- back), so a caller leaving it open in a transaction cannot block the
-- owner. Tables: slot_lease (update on a change of owner or ttl), sub_state
-- (append on a renewal).
create or replace function pgque.claim_slot(i_queue text, i_consumer text, i_slot integer, i_worker text,
                                            i_ttl interval default '30 seconds', i_token uuid default null,
                                            out epoch bigint, out token uuid)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l       pgque.slot_lease;
    v_now   timestamptz := clock_timestamp();
    v_ttl   interval;
    v_held  boolean;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_worker(i_worker);
    v_ttl := pgque._lease_ttl(i_ttl, v_now);
    if i_slot is null then
        raise exception using errcode = '22004', message = 'slot must not be NULL';
    end if;
    begin
        l := pgque._lease(i_queue, i_consumer, i_slot);
        v_held := pgque._lease_proved(l, i_worker, i_token);
        if not v_held and l.sl_owner is not null and pgque._lease_until(l) > v_now then
            -- Refused: undo the row lock with the subtransaction.
            raise exception using errcode = 'PQ099';
        end if;
    exception when sqlstate 'PQ099' then
        return;
    end;
    if v_held then
        if l.sl_ttl = v_ttl then
            -- A renewal: an appended state record, no row version.
            perform pgque._touch_state(l.sl_sub);
        else
            update pgque.slot_lease set sl_until = v_now + v_ttl, sl_ttl = v_ttl
             where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
        end if;
        epoch := l.sl_epoch;
        token := i_token;
        return;
    end if;
    token := pg_catalog.gen_random_uuid();
    update pgque.slot_lease
       set sl_owner = i_worker, sl_until = v_now + v_ttl, sl_ttl = v_ttl, sl_epoch = sl_epoch + 1,
           sl_token = pgque._token_hash(token)
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
    epoch := l.sl_epoch + 1;
end;
$$;

-- release_slot(queue, consumer, slot, worker, token): gives the lease up.
-- Only its holder can: returns true when released; PQ085 when (worker,
-- token) does not prove the lease (see _hold_lease). Tables: slot_lease.
create or replace function pgque.release_slot(i_queue text, i_consumer text, i_slot integer, i_worker text,
                                              i_token uuid)
returns boolean language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_worker(i_worker);
    perform pgque._check_token(i_token);
    if i_slot is null then
        raise exception using errcode = '22004', message = 'slot must not be NULL';
    end if;
    l := pgque._lease(i_queue, i_consumer, i_slot);
    perform pgque._refuse_unproved(l, i_worker, i_token);
    update pgque.slot_lease set sl_owner = null, sl_until = null, sl_token = null
     where sl_queue = l.sl_queue and sl_consumer = l.sl_consumer and sl_slot = l.sl_slot;
    return true;
end;
$$;

-- _refuse_unproved(lease, worker, token): raises PQ085 unless (worker,
-- token) proves the lease. The message names the slot only: never the
-- token, nor the owner's worker id (a caller may have presented it).
create or replace function pgque._refuse_unproved(l pgque.slot_lease, i_worker text, i_token uuid)
returns void language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
begin
    if not pgque._lease_proved(l, i_worker, i_token) then
        raise exception using errcode = 'PQ085',
            message = format('the lease token does not prove the lease on slot %s of consumer %L',
                             l.sl_slot, l.sl_consumer),
            hint = 'claim the slot again: claim_slot returns a new token';
    end if;
end;
$$;

-- _hold_lease(queue, consumer, slot, nslots, worker, token): the lease row,
-- locked, after checking N and that (worker, token) proves the lease (PQ085
-- otherwise: the lease changed hands, was released, or the caller never
-- held it). Every call that acts as the holder goes through here.
-- Renews the lease when less than half of its ttl is left: the heartbeat
-- rides on the per-batch calls, at most two appended state records per ttl
-- when the slot writes no state otherwise.
create or replace function pgque._hold_lease(i_queue text, i_consumer text, i_slot integer,
                                             i_nslots integer, i_worker text, i_token uuid)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    l     pgque.slot_lease;
    v_now timestamptz;
begin
    perform pgque._check_worker(i_worker);
    perform pgque._check_token(i_token);
    perform pgque._check_slot(i_slot, i_nslots);
    perform pgque._slot_group(i_queue, i_consumer, i_nslots);
    l := pgque._lease(i_queue, i_consumer, i_slot);
    perform pgque._refuse_unproved(l, i_worker, i_token);
    v_now := clock_timestamp();
    l.sl_until := pgque._lease_until(l);
    if l.sl_until - v_now < l.sl_ttl / 2 then
        perform pgque._touch_state(l.sl_sub);
        l.sl_until := v_now + l.sl_ttl;
    end if;
    return l;
end;
$$;


-- ==== partition/functions/pgque.pause.sql ====
-- The pause failure policy (G3).
--
-- Under pause, when the head event of key K fails on a slot, K is blocked
-- on that slot: later events of K, in the same chunk or later batches, are
-- deferred through the engine's event_defer primitive (not delivered, not
-- dropped, not counted as retries) while every other key keeps flowing and
-- the slot's cursor keeps moving. When the head succeeds on a retry, or is
-- dead-lettered, the deferred events are put back and delivered in ev_id
-- order before any newer event of K. The state is one key_block row per
-- blocked key; healthy events cost a read of key_block only while the slot
-- has a blocked key, and no write ever.

-- _kid(key): the key spelled so that NULL is a key of its own.
create or replace function pgque._kid(i_key text)
returns text language sql immutable
as $$ select case when i_key is null then 'n' else 'k' operator(pg_catalog.||) i_key end $$;

-- _key_filter(key): a predicate selecting the key's events, built from an
-- integer (the key's hash) so no caller string enters SQL text; callers
-- re-check the exact key on each row.
create or replace function pgque._key_filter(i_key text)
returns text language sql immutable
set search_path = pg_catalog, pg_temp
as $$
    select case when i_key is null then 'ev_extra1 is null'
                else 'pg_catalog.hashtextextended(ev_extra1, 0) = ' || hashtextextended(i_key, 0) end
$$;

-- _resolve_block(sub, kid): the awaited event of a blocked or releasing key
-- was acknowledged or dead-lettered: put the deferred events back (state
-- releasing until the last of them is acknowledged), or drop the block
-- when nothing is deferred.
--
-- While the slot's batch is open, only the deferred events up to its
-- acknowledged position are put back. The batch's later events are still
-- to come, and an event put back goes to a later batch: a later event of
-- the key still in the open batch, with a smaller ev_id than a deferred
-- one, would otherwise be handed out first (deferred events come from
-- earlier batches too, and put-back events of a batch are mixed with newer
-- ones). Those later events are above the position, so they are deferred
-- behind what was put back. When nothing could be put back yet, the block
-- stays releasing with kb_wait -1 (every event of the key is deferred) and
-- receive_partitioned resolves it again (_release_pending) as the batch
-- moves on. Tables: sub_state (read), deferred, event, key_block.
create or replace function pgque._resolve_block(i_sub integer, i_kid text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st      pgque.sub_state := pgque._sub_state(i_sub);
    v_bound bigint := case when st.st_batch is null then null else coalesce(st.st_acked_to, -1) end;
    v_count integer;
    v_max   bigint;
begin
    with moved as (
        delete from pgque.deferred d
         where d.ev_owner = i_sub and d.ev_group = i_kid and (v_bound is null or d.ev_id <= v_bound)
        returning d.*
    ), ins as (
        insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                                 ev_extra1, ev_extra2, ev_extra3, ev_extra4)
        select m.ev_id, m.ev_time, q.queue_id * 16 + q.queue_cur_table, m.ev_owner, m.ev_retry,
               m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4
          from moved m join pgque.queue q on q.queue_id = m.ev_queue
        returning ev_id
    )
    select count(*), max(ins.ev_id) into v_count, v_max from ins;
    if v_count > 0 then
        -- Let the ticker see pending work, as _undefer does.
        perform nextval(q.queue_event_seq)
           from pgque.queue q join pgque.subscription s on s.sub_queue = q.queue_id
          where s.sub_id = i_sub;
        update pgque.key_block
           set kb_state = 'releasing', kb_wait = v_max, kb_wait_batch = null
         where kb_sub = i_sub and kb_kid = i_kid;
    elsif exists (select 1 from pgque.deferred d where d.ev_owner = i_sub and d.ev_group = i_kid) then
        update pgque.key_block
           set kb_state = 'releasing', kb_wait = -1, kb_wait_batch = null
         where kb_sub = i_sub and kb_kid = i_kid;
    else
        delete from pgque.key_block where kb_sub = i_sub and kb_kid = i_kid;
    end if;
end;
$$;

-- _release_pending(sub): resolves again the blocks that are releasing with
-- nothing put back yet (kb_wait -1), once the slot's batch moved on.
-- Tables: key_block, and those of _resolve_block.
create or replace function pgque._release_pending(i_sub integer)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_kid text;
begin
    for v_kid in select kb_kid from pgque.key_block
                  where kb_sub = i_sub and kb_state = 'releasing' and kb_wait = -1 loop
        perform pgque._resolve_block(i_sub, v_kid);
    end loop;
end;
$$;

-- _pause_on_ack(sub, batch): resolves the blocks whose awaited event was
-- handed out in the batch whose chunk was just acknowledged.
create or replace function pgque._pause_on_ack(i_sub integer, i_batch bigint)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_kid text;
begin
    for v_kid in select kb_kid from pgque.key_block
                  where kb_sub = i_sub and kb_wait_batch = i_batch loop
        perform pgque._resolve_block(i_sub, v_kid);
    end loop;
end;
$$;

-- _pause_on_nack(lease, batch, msg_id, key, retried, reason): the handler
-- failed on msg_id of key. Defers the rest of the key in the chunk already
-- handed out (the worker skipped them), then blocks the key with msg_id as
-- its head, or, when the head was dead-lettered, resolves at once.
create or replace function pgque._pause_on_nack(l pgque.slot_lease, i_nslots integer, i_batch bigint,
                                                i_msg_id bigint, i_key text, i_retried boolean,
                                                i_reason text)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_kid  text := pgque._kid(i_key);
    v_upto bigint;
    r      record;
    c      refcursor := 'pgque_pause_' || i_batch;
begin
    select st_delivered_to into v_upto from pgque._sub_state(l.sl_sub) where st_batch = i_batch;
    if v_upto is not null and v_upto > i_msg_id then
        for r in select * from pgque.get_batch_cursor(i_batch, c::text, 2147483647,
                     concat_ws(' and ', pgque._slot_filter(l.sl_slot, i_nslots), pgque._key_filter(i_key),
                               'ev_id > ' || i_msg_id, 'ev_id <= ' || v_upto)) loop
            if r.ev_extra1 is not distinct from i_key then
                perform pgque._defer_row(l.sl_sub, v_kid, r.ev_id, r.ev_time, r.ev_retry, r.ev_type, r.ev_data,
                                         r.ev_extra1, r.ev_extra2, r.ev_extra3, r.ev_extra4);
            end if;
        end loop;
        close c;
    end if;

    insert into pgque.key_block as kb (kb_sub, kb_kid, kb_key, kb_state, kb_head, kb_wait, kb_failures, kb_reason)
    values (l.sl_sub, v_kid, i_key, 'blocked', i_msg_id, i_msg_id, 1, i_reason)
    on conflict (kb_sub, kb_kid) do update
       set kb_state = 'blocked', kb_head = excluded.kb_head, kb_wait = excluded.kb_wait,
           kb_wait_batch = null, kb_reason = excluded.kb_reason,
           kb_failures = case when kb.kb_head = excluded.kb_head then kb.kb_failures + 1 else 1 end;
    if not i_retried then
        perform pgque._resolve_block(l.sl_sub, v_kid);
    end if;
end;
$$;

-- _pause_keep(sub, batch, msg_id, key): whether a row handed out under
-- pause is delivered (true) or deferred (false); records when the awaited
-- event of a blocked key is handed out.
create or replace function pgque._pause_keep(i_sub integer, i_batch bigint, i_msg_id bigint, i_key text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block;
begin
    select * into b from pgque.key_block where kb_sub = i_sub and kb_kid = pgque._kid(i_key);
    if not found then
        return true;
    end if;
    if i_msg_id = b.kb_wait then
        update pgque.key_block set kb_wait_batch = i_batch where kb_sub = i_sub and kb_kid = b.kb_kid;
        return true;
    end if;
    -- Blocked: only the head's retry passes. Releasing: the events put back
    -- (up to kb_wait) pass in ev_id order; newer ones wait for the next round.
    return b.kb_state = 'releasing' and i_msg_id < b.kb_wait;
end;
$$;

-- set_failure_policy(queue, consumer, policy): 'skip' or 'pause' for all
-- slots of a consumer. Switching to skip releases every blocked key (a key
-- held while its lane runs stays held until the lane settles it). Returns 1.
create or replace function pgque.set_failure_policy(i_queue text, i_consumer text, i_policy text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    b record;
begin
    if i_policy is null or i_policy not in ('skip', 'pause') then
        raise exception using errcode = 'PQ011',
            message = format('failure policy must be ''skip'' or ''pause'', not %s', coalesce(quote_literal(i_policy), 'NULL'));
    end if;
    update pgque.slot_group set sg_policy = i_policy where sg_queue = q.queue_id and sg_consumer = i_consumer;
    if not found then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    if i_policy = 'skip' then
        for b in select kb.kb_sub, kb.kb_kid from pgque.key_block kb join pgque.slot_lease l on l.sl_sub = kb.kb_sub
                  where l.sl_queue = q.queue_id and l.sl_consumer = i_consumer
                    and kb.kb_state <> 'inflight' loop
            perform pgque._undefer(b.kb_sub, b.kb_kid);
            delete from pgque.key_block where kb_sub = b.kb_sub and kb_kid = b.kb_kid;
        end loop;
    end if;
    return 1;
end;
$$;

-- blocked_keys(queue, consumer): the blocked keys of a consumer's slots:
-- slot, key, state, head ev_id, since, failures so far, last reason, and
-- how many events are deferred behind the head.
create or replace function pgque.blocked_keys(i_queue text, i_consumer text default null)
returns table (queue text, consumer text, slot integer, key text, state text, head_ev_id bigint,
               since timestamptz, failures integer, reason text, deferred bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    return query
    select q.queue_name, l.sl_consumer, l.sl_slot, kb.kb_key, kb.kb_state, kb.kb_head, kb.kb_since,
           kb.kb_failures, kb.kb_reason,
           (select count(*) from pgque.deferred d where d.ev_owner = kb.kb_sub and d.ev_group = kb.kb_kid)
      from pgque.key_block kb
      join pgque.slot_lease l on l.sl_sub = kb.kb_sub
     where l.sl_queue = q.queue_id and (i_consumer is null or l.sl_consumer = i_consumer)
     order by l.sl_consumer, l.sl_slot, kb.kb_since;
end;
$$;

-- _blocked(queue, consumer, key): the block row of a key, or PQ036 (not
-- blocked).
create or replace function pgque._blocked(i_queue text, i_consumer text, i_key text)
returns pgque.key_block language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block;
begin
    select kb.* into b
      from pgque.key_block kb
      join pgque.slot_lease l on l.sl_sub = kb.kb_sub
      join pgque.queue q on q.queue_id = l.sl_queue
     where q.queue_name = i_queue and l.sl_consumer = i_consumer and kb.kb_kid = pgque._kid(i_key)
       for update of kb;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ036',
            message = format('key %s is not blocked for consumer %L on queue %L',
                             coalesce(quote_literal(i_key), 'NULL'), i_consumer, i_queue);
    end if;
    return b;
end;
$$;

-- unblock_key(queue, consumer, key): dead-letters the head of a blocked key
-- (its pending retry) and releases the events deferred behind it. Raises
-- PQ036 when the key is not blocked (or is already releasing) and PQ037
-- when its head is being redelivered right now (try again after that
-- delivery). Returns the dead-lettered ev_id.
create or replace function pgque.unblock_key(i_queue text, i_consumer text, i_key text)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block := pgque._blocked(i_queue, i_consumer, i_key);
    r pgque.retry_queue;
    s pgque.subscription;
begin
    if b.kb_state <> 'blocked' then
        raise exception using errcode = 'PQ036',
            message = format('key %s is not blocked by a failing head (it is %s)', coalesce(quote_literal(i_key), 'NULL'), b.kb_state);
    end if;
    delete from pgque.retry_queue where ev_owner = b.kb_sub and ev_id = b.kb_head returning * into r;
    if not found then
        raise exception using errcode = 'PQ037',
            message = format('the head %s of key %s is being redelivered; try again once it was handled',
                             b.kb_head, coalesce(quote_literal(i_key), 'NULL'));
    end if;
    select * into s from pgque.subscription where sub_id = b.kb_sub;
    insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    values (s.sub_queue, s.sub_name, coalesce('unblocked by an operator; last failure: ' || b.kb_reason, 'unblocked by an operator'),
            r.ev_id, r.ev_time, r.ev_retry, r.ev_type, r.ev_data, r.ev_extra1, r.ev_extra2, r.ev_extra3, r.ev_extra4);
    perform pgque._resolve_block(b.kb_sub, b.kb_kid);
    return r.ev_id;
end;
$$;

-- retry_key_now(queue, consumer, key): makes the pending retry of a blocked
-- key's head due now and moves it back into the log. Returns 1 when there
-- was a pending retry, 0 otherwise.
create or replace function pgque.retry_key_now(i_queue text, i_consumer text, i_key text)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    b pgque.key_block := pgque._blocked(i_queue, i_consumer, i_key);
begin
    update pgque.retry_queue set ev_retry_after = clock_timestamp()
     where ev_owner = b.kb_sub and ev_id = b.kb_head;
    if not found then
        return 0;
    end if;
    perform pgque.maint_retry_events();
    return 1;
end;
$$;


-- ==== partition/functions/pgque.key_hold.sql ====
-- Key holds: how a slot worked by key lanes lets its cursor move past a
-- slow key (see structure/key_hold.sql for the state).
--
-- hold_key_partitioned, called in the chunk's settling transaction before
-- ack_partitioned, defers copies of a running key's events of the chunk
-- from its running head on and marks the key inflight: receive_partitioned
-- then defers every later event of it, and the chunk can be acknowledged.
-- settle_held_partitioned, when the key's lane finished, drops the copies of
-- the events it handled, retries or dead-letters the failed ones and puts
-- the rest of the group back into the log, in ev_id order (state releasing,
-- as after a pause). release_stale_holds_partitioned, called whenever a
-- worker starts working a slot, turns the holds left there into such a release,
-- the running head first, so a crash loses nothing and keeps per-key order.
-- Healthy keys never cause a write here.

-- Earlier forms took no proof of the chunk (epoch, batch) or epoch.
drop function if exists pgque.hold_key_partitioned(text, text, integer, integer, text, text, bigint);
drop function if exists pgque.settle_held_partitioned(text, text, integer, integer, text, text, bigint,
                                                      bigint[], bigint[], interval[], text[]);
-- Forms without the lease token.
drop function if exists pgque.hold_key_partitioned(text, text, integer, integer, text, bigint, bigint, text, bigint);
drop function if exists pgque.settle_held_partitioned(text, text, integer, integer, text, bigint, text, bigint,
                                                      bigint[], bigint[], interval[], text[]);
drop function if exists pgque.release_stale_holds_partitioned(text, text, integer, integer, text);

-- hold_key_partitioned(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, key, head): holds key (NULL is the NULL key) from its event
-- head on. head must be an event of key in the chunk the slot handed out
-- last, received under epoch in batch_id (_check_delivery: PQ032 when the
-- lease changed epoch since, PQ035 when that chunk is no longer the one out;
-- PQ022 when head is not an event of key there). Returns how many events
-- were deferred. Tables: sub_state (read), deferred (insert), key_block
-- (upsert).
create or replace function pgque.hold_key_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                      i_nslots integer, i_worker text, i_token uuid,
                                                      i_epoch bigint, i_batch_id bigint,
                                                      i_key text, i_head bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l       pgque.slot_lease;
    st      pgque.sub_state;
    v_kid   text := pgque._kid(i_key);
    v_n     integer := 0;
    v_head  boolean := false;
    r       record;
    c       refcursor;
begin
    if i_epoch is null or i_batch_id is null or i_head is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and head must not be NULL';
    end if;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    st := pgque._check_delivery(l, i_epoch, i_batch_id, i_head);
    c := 'pgque_hold_' || st.st_batch;
    for r in select * from pgque.get_batch_cursor(st.st_batch, c::text, 2147483647,
                 concat_ws(' and ', pgque._slot_filter(i_slot, i_nslots), pgque._key_filter(i_key),
                           'ev_id >= ' || i_head, 'ev_id <= ' || st.st_delivered_to)) loop
        if r.ev_extra1 is not distinct from i_key then
            v_head := v_head or r.ev_id = i_head;
            v_n := v_n + pgque._defer_row(l.sl_sub, v_kid, r.ev_id, r.ev_time, r.ev_retry, r.ev_type,
                                          r.ev_data, r.ev_extra1, r.ev_extra2, r.ev_extra3, r.ev_extra4);
        end if;
    end loop;
    close c;
    if not v_head then
        raise exception using errcode = 'PQ022',
            message = format('event %s of key %s is not in the delivered part of batch %s of slot %s',
                             i_head, coalesce(quote_literal(i_key), 'NULL'), st.st_batch, i_slot);
    end if;
    insert into pgque.key_block as kb (kb_sub, kb_kid, kb_key, kb_state, kb_head, kb_wait, kb_epoch)
    values (l.sl_sub, v_kid, i_key, 'inflight', i_head, -1, l.sl_epoch)
    on conflict (kb_sub, kb_kid) do update
       set kb_state = 'inflight', kb_head = excluded.kb_head, kb_wait = -1, kb_wait_batch = null,
           kb_epoch = excluded.kb_epoch;
    return v_n;
end;
$$;

-- settle_held_partitioned(queue, consumer, slot, nslots, worker, token,
-- epoch, key, head, done, failed, retry_after, reasons): the lane of a key held
-- from head under epoch (the lease epoch its events were received under;
-- PQ032 when the lease is at another epoch now) finished. done are the held events it handled; failed (with one delay and
-- one reason each) the ones whose handler failed: each is retried, or
-- dead-lettered past max_retries or when its delay is NULL (as nack). Under pause, a retried failure blocks the
-- key (state blocked, as nack_partitioned would); otherwise the rest of the
-- key's deferred events is put back in ev_id order. Returns 1, or 0 when the
-- hold is no longer this epoch's (a new owner released it: the events are
-- redelivered). Tables: deferred, retry_queue, dead_letter, key_block.
create or replace function pgque.settle_held_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                         i_nslots integer, i_worker text, i_token uuid, i_epoch bigint,
                                                         i_key text, i_head bigint, i_done bigint[], i_failed bigint[],
                                                         i_retry_after interval[], i_reasons text[])
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l        pgque.slot_lease;
    v_kid    text := pgque._kid(i_key);
    b        pgque.key_block;
    d        pgque.deferred;
    q        pgque.queue;
    s        pgque.subscription;
    v_pause  boolean;
    v_block  bigint;
    v_reason text;
begin
    if i_head is null or i_epoch is null then
        raise exception using errcode = '22004', message = 'epoch and head must not be NULL';
    end if;
    if coalesce(cardinality(i_failed), 0) <> coalesce(cardinality(i_retry_after), 0)
       or coalesce(cardinality(i_failed), 0) <> coalesce(cardinality(i_reasons), 0) then
        raise exception using errcode = 'PQ011',
            message = 'failed, retry_after and reasons must have the same length';
    end if;
    for i in 1 .. coalesce(cardinality(i_failed), 0) loop
        if i_failed[i] is null then
            raise exception using errcode = '22004', message = 'failed events must not be NULL';
        end if;
        if i_retry_after[i] < interval '0' then
            raise exception using errcode = 'PQ011',
                message = format('retry delay must not be negative, not %s', i_retry_after[i]);
        end if;
    end loop;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    if i_epoch <> l.sl_epoch then
        raise exception using errcode = 'PQ032',
            message = format('the key was held under epoch %s of slot %s of consumer %L; the lease is at epoch %s',
                             i_epoch, l.sl_slot, l.sl_consumer, l.sl_epoch);
    end if;
    select * into b from pgque.key_block where kb_sub = l.sl_sub and kb_kid = v_kid for update;
    if not found or b.kb_state <> 'inflight' or b.kb_head <> i_head or b.kb_epoch is distinct from i_epoch then
        return 0;
    end if;

    delete from pgque.deferred
     where ev_owner = l.sl_sub and ev_group = v_kid and ev_id = any(coalesce(i_done, '{}'));

    select sg_policy = 'pause' into v_pause from pgque.slot_group
     where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer;
    select * into s from pgque.subscription where sub_id = l.sl_sub;
    select * into q from pgque.queue where queue_id = s.sub_queue;
    for i in 1 .. coalesce(cardinality(i_failed), 0) loop
        delete from pgque.deferred
         where ev_owner = l.sl_sub and ev_group = v_kid and ev_id = i_failed[i]
        returning * into d;
        if not found then
            raise exception using errcode = 'PQ022',
                message = format('event %s is not held for key %s', i_failed[i], coalesce(quote_literal(i_key), 'NULL'));
        end if;
        if i_retry_after[i] is null or coalesce(d.ev_retry, 0) >= q.queue_max_retries then
            insert into pgque.dead_letter (dl_queue, dl_consumer, dl_reason, ev_id, ev_time, ev_retry,
                                           ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
            values (s.sub_queue, s.sub_name, i_reasons[i], d.ev_id, d.ev_time, coalesce(d.ev_retry, 0),
                    d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4);
        else
            insert into pgque.retry_queue (ev_owner, ev_id, ev_queue, ev_retry_after, ev_time, ev_retry,
                                           ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
            values (l.sl_sub, d.ev_id, s.sub_queue, clock_timestamp() + i_retry_after[i], d.ev_time,
                    coalesce(d.ev_retry, 0) + 1, d.ev_type, d.ev_data, d.ev_extra1, d.ev_extra2, d.ev_extra3, d.ev_extra4)
            on conflict (ev_owner, ev_id) do nothing;
            if v_pause and v_block is null then
                v_block := d.ev_id;
                v_reason := i_reasons[i];
            end if;
        end if;
    end loop;

    if v_block is not null then
        update pgque.key_block
           set kb_state = 'blocked', kb_head = v_block, kb_wait = v_block, kb_wait_batch = null,
               kb_epoch = null, kb_reason = v_reason,
               kb_failures = case when kb_head = v_block then kb_failures + 1 else 1 end
         where kb_sub = l.sl_sub and kb_kid = v_kid;
    else
        perform pgque._resolve_block(l.sl_sub, v_kid);
    end if;
    return 1;
end;
$$;

-- release_stale_holds_partitioned(queue, consumer, slot, nslots, worker,
-- token):
-- the caller, the slot's owner, starting to work the slot with no lane of
-- it running, releases every hold left on the slot — by an earlier owner,
-- or by itself before it lost and re-took the slot under the same epoch:
-- their deferred events, running head first, go back into the log.
-- Events of such a key deferred by a chunk the earlier owner never
-- acknowledged are left to that chunk, which is delivered again. Returns
-- how many events were put back (they are handled again).
-- Tables: sub_state (read), key_block, deferred, event.
create or replace function pgque.release_stale_holds_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                                 i_nslots integer, i_worker text, i_token uuid)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l    pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    b    record;
    st   pgque.sub_state := pgque._sub_state(l.sl_sub);
    r    record;
    c    refcursor;
    v_n  integer := 0;
begin
    -- The earlier owner may have received a chunk it never acknowledged:
    -- events of a held key it deferred there come again with that chunk,
    -- so their deferred copies are dropped rather than released twice.
    for b in select kb_kid, kb_key from pgque.key_block
              where kb_sub = l.sl_sub and kb_state = 'inflight'
              for update loop
        if st.st_batch is not null and st.st_delivered_to is not null then
            c := 'pgque_stale_' || st.st_batch;
            for r in select * from pgque.get_batch_cursor(st.st_batch, c::text, 2147483647,
                         concat_ws(' and ', pgque._slot_filter(i_slot, i_nslots), pgque._key_filter(b.kb_key),
                                   'ev_id > ' || coalesce(st.st_acked_to, -1), 'ev_id <= ' || st.st_delivered_to)) loop
                if r.ev_extra1 is not distinct from b.kb_key then
                    delete from pgque.deferred
                     where ev_owner = l.sl_sub and ev_group = b.kb_kid and ev_id = r.ev_id;
                end if;
            end loop;
            close c;
        end if;
        v_n := v_n + (select count(*) from pgque.deferred d where d.ev_owner = l.sl_sub and d.ev_group = b.kb_kid);
        perform pgque._resolve_block(l.sl_sub, b.kb_kid);
    end loop;
    return v_n;
end;
$$;


-- ==== partition/functions/pgque.receive_partitioned.sql ====
-- Consuming a slot. Each call first proves the caller holds the slot's
-- lease (and renews it), then delivers through the api layer with the
-- slot's routing predicate. The epoch is returned with every row as a
-- fencing token for the handler's side effects. The lease token claim_slot
-- returned is the caller's credential: every function here takes it after
-- the worker id.

-- Forms without a lease token, and the acknowledgement without a proof of
-- the chunk (removed: use the fenced ack_partitioned with the token).
drop function if exists pgque.receive_partitioned(text, text, integer, integer, text, integer);
drop function if exists pgque.ack_partitioned(text, text, integer, integer, text);
drop function if exists pgque.ack_partitioned(text, text, integer, integer, text, bigint, bigint, bigint);
drop function if exists pgque.nack_partitioned(text, text, integer, integer, text, bigint, interval, text);
drop function if exists pgque.nack_partitioned(text, text, integer, integer, text, bigint, bigint, bigint, interval, text);
drop function if exists pgque._fenced_lease(text, text, integer, integer, text, bigint, bigint, bigint);

-- _receive_slot(queue, consumer, lease, slot, nslots, max): the body of
-- both receive forms, for a caller that proved the lease of slot of nslots:
-- the next chunk of the slot's open batch, events of this slot only, in
-- ev_id order, payload as stored (text). Not granted.
create or replace function pgque._receive_slot(i_queue text, i_consumer text, l pgque.slot_lease,
                                               i_slot integer, i_nslots integer, i_max integer)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text)
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_sub    text := pgque._slot_name(i_consumer, i_slot, i_nslots);
    v_filter text := pgque._slot_filter(i_slot, i_nslots);
    r        record;
    v_batch  bigint;
    v_out    integer;
    v_round  integer := 0;
    v_kids   text[];
begin
    -- Fast path: no blocked key on this slot (always so under skip).
    if not exists (select 1 from pgque.key_block where kb_sub = l.sl_sub) then
        return query select d.* from pgque._deliver_raw(i_queue, v_sub, i_max, i_slot, i_nslots, i_max::bigint * i_nslots) d;
        if not found then
            -- A sealed slot with nothing left may complete a resize.
            perform pgque._resize_poll(l);
        end if;
        return;
    end if;
    -- Pause with blocked keys: defer what must wait; a chunk that was all
    -- deferred is acknowledged here and the next one is fetched. The slot's
    -- blocked keys are read once per call, so rows of healthy keys cost one
    -- array test, not a lookup. The chunk is read whole (a function scan
    -- runs _deliver_raw to its end) before any of it is deferred.
    perform pgque._release_pending(l.sl_sub);
    v_kids := array(select kb_kid from pgque.key_block where kb_sub = l.sl_sub);
    loop
        v_batch := null;
        v_out := 0;
        for r in select * from pgque._deliver_raw(i_queue, v_sub, i_max, i_slot, i_nslots, i_max::bigint * i_nslots) loop
            v_batch := r.batch_id;
            if not ((case when r.partition_key is null then 'n' else 'k' || r.partition_key end) = any(v_kids))
               or pgque._pause_keep(l.sl_sub, r.batch_id, r.msg_id, r.partition_key) then
                msg_id := r.msg_id;
                batch_id := r.batch_id;
                type := r.type;
                payload := r.payload;
                retry_count := r.retry_count;
                created_at := r.created_at;
                partition_key := r.partition_key;
                extra2 := r.extra2;
                extra3 := r.extra3;
                extra4 := r.extra4;
                return next;
                v_out := v_out + 1;
            else
                perform pgque._defer_row(l.sl_sub, pgque._kid(r.partition_key), r.msg_id, r.created_at,
                                         r.retry_count, r.type, r.payload, r.partition_key,
                                         r.extra2, r.extra3, r.extra4);
            end if;
        end loop;
        if v_batch is null then
            perform pgque._resize_poll(l);
        end if;
        if v_batch is null or v_out > 0 then
            return;
        end if;
        perform pgque._ack(v_batch, v_filter);
        v_round := v_round + 1;
        exit when v_round >= 100;
    end loop;
end;
$$;

-- receive_partitioned(queue, consumer, slot, nslots, worker, token, max):
-- the next chunk of the slot's open batch: events of this slot only, in
-- ev_id order, payload as jsonb (data that is not JSON, which only
-- insert_event can store, becomes a JSON string; see _payload).
create or replace function pgque.receive_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                     i_nslots integer, i_worker text, i_token uuid,
                                                     i_max integer default 100)
returns table (msg_id bigint, batch_id bigint, type text, payload jsonb, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text,
               epoch bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    v_access boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l        pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    v_rows   pgque.message[];
begin
    -- The chunk is made whole before it is returned: a payload that is
    -- not JSON fails the cast, and the chunk is read again (its state
    -- change was rolled back with the cast) with such payloads as strings.
    begin
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, d.payload::jsonb, d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._receive_slot(i_queue, i_consumer, l, i_slot, i_nslots, i_max) d);
    exception when data_exception or program_limit_exceeded then
        v_rows := array(select row(d.msg_id, d.batch_id, d.type, pgque._payload(d.payload), d.retry_count, d.created_at,
                                   d.partition_key, d.extra2, d.extra3, d.extra4)::pgque.message
                          from pgque._receive_slot(i_queue, i_consumer, l, i_slot, i_nslots, i_max) d);
    end;
    return query select m.*, l.sl_epoch from unnest(v_rows) m;
end;
$$;

-- receive_partitioned_raw(queue, consumer, slot, nslots, worker, token,
-- max[, ack_epoch, ack_batch_id, ack_msg_id]): receive_partitioned with
-- the payload as stored (text), as receive_raw is receive: no jsonb is
-- built or printed per event, which is most of a chunk's server time for
-- small events. What the Go PartitionedConsumer calls. With the ack_
-- arguments (the proof ack_partitioned takes) it first acknowledges the
-- chunk the slot handed out last, exactly as ack_partitioned would, and
-- then receives, in one statement: a slot working chunk after chunk saves
-- a round trip, a transaction and a lease check per chunk. When any part
-- fails nothing is acknowledged and the chunk is received again. Defined in api/functions/
-- pgque.deliver_raw.sql from _deliver_raw's body, as receive_raw is: a
-- function that returns another's rows copies each into a result store of
-- its own, and receive_partitioned_raw over _receive_slot over
-- _deliver_raw made three. A slot with blocked keys still goes through
-- _receive_slot.

-- The form without the ack arguments: calls with seven or fewer arguments
-- now resolve to the one above.
drop function if exists pgque.receive_partitioned_raw(text, text, integer, integer, text, uuid, integer);

do $receive_partitioned_raw$
begin
    -- receive_partitioned_raw: the slot's subscription under its lease,
    -- each row with the lease's epoch; a slot with blocked keys (the pause
    -- policy) goes through _receive_slot, which defers what must wait, and
    -- a sealed slot found empty may complete a resize (_resize_poll), as
    -- _receive_slot does. The access check, the lease and the slot's name
    -- come first, in the declarations, in that order.
    execute format($ddl$
create or replace function pgque.receive_partitioned_raw(i_queue text, i_consumer text, i_slot integer,
                                                         i_nslots integer, i_worker text, i_token uuid,
                                                         i_max integer default 100, i_ack_epoch bigint default null,
                                                         i_ack_batch_id bigint default null,
                                                         i_ack_msg_id bigint default null)
returns table (msg_id bigint, batch_id bigint, type text, payload text, retry_count integer,
               created_at timestamptz, partition_key text, extra2 text, extra3 text, extra4 text,
               epoch bigint)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as %L$ddl$, replace(replace(replace(replace(replace(pgque._deliver_raw_body(),
        '/*<declare>*/', $decl$    v_access    boolean := pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l           pgque.slot_lease := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    i_sub       text := pgque._slot_name(i_consumer, i_slot, i_nslots);
    i_span      bigint := i_max::bigint * i_nslots;
    i_ack_batch bigint;
$decl$),
        '/*<entry>*/', $entry$    if exists (select 1 from pgque.key_block kb where kb.kb_sub = l.sl_sub) then
        if i_ack_epoch is not null or i_ack_batch_id is not null or i_ack_msg_id is not null then
            -- ack_partitioned's checks and acknowledgement (with the pause
            -- policy's bookkeeping), under the lease just proved (a partial
            -- proof is 22004).
            perform pgque._check_delivery(l, i_ack_epoch, i_ack_batch_id, i_ack_msg_id);
            perform pgque._ack_slot(l, i_slot, i_nslots);
        end if;
        return query select d.*, l.sl_epoch
                       from pgque._receive_slot(i_queue, i_consumer, l, i_slot, i_nslots, i_max) d;
        return;
    end if;
    if i_ack_epoch is not null or i_ack_batch_id is not null or i_ack_msg_id is not null then
        -- ack_partitioned's checks, under the lease just proved; with no
        -- blocked key there is nothing for the pause policy to do, and
        -- the acknowledgement is made below in memory, as receive_raw
        -- makes its own, with the rest of the call's state change: one
        -- state record in all.
        perform pgque._check_delivery(l, i_ack_epoch, i_ack_batch_id, i_ack_msg_id);
        i_ack_batch := i_ack_batch_id;
    end if;
$entry$),
        '/*<epoch>*/', ', l.sl_epoch'), '/*<epoch param>*/', ', $9'),
        '/*<done>*/', $done$    if v_last is null then
        perform pgque._resize_poll(l);
    end if;
$done$));
end
$receive_partitioned_raw$;

-- _slot_batch(lease): the slot's open batch, or PQ020.
create or replace function pgque._slot_batch(l pgque.slot_lease)
returns bigint language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch bigint;
begin
    v_batch := (pgque._sub_state(l.sl_sub)).st_batch;
    if v_batch is null then
        raise exception using errcode = 'PQ020',
            message = format('slot %s of consumer %L has no open batch', l.sl_slot, l.sl_consumer);
    end if;
    return v_batch;
end;
$$;

-- _check_delivery(lease, epoch, batch, msg_id): proves that the caller
-- settles the chunk the slot handed out last: its lease epoch is the
-- current one (PQ032 otherwise: the lease changed hands since it
-- received), and msg_id, an event it received, is in the slot's current
-- delivered chunk of batch (PQ035 otherwise: that chunk was acknowledged
-- already, possibly by another owner, and a newer one is out). Returns the
-- state.
create or replace function pgque._check_delivery(l pgque.slot_lease, i_epoch bigint, i_batch bigint, i_msg_id bigint)
returns pgque.sub_state language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    st pgque.sub_state;
begin
    if i_epoch is null or i_batch is null or i_msg_id is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and msg_id must not be NULL';
    end if;
    if i_epoch <> l.sl_epoch then
        raise exception using errcode = 'PQ032',
            message = format('the chunk was received under epoch %s of slot %s of consumer %L; the lease is at epoch %s',
                             i_epoch, l.sl_slot, l.sl_consumer, l.sl_epoch);
    end if;
    st := pgque._sub_state(l.sl_sub);
    if st.st_batch is distinct from i_batch or st.st_delivered_to is null
       or i_msg_id > st.st_delivered_to or i_msg_id <= coalesce(st.st_acked_to, -1) then
        raise exception using errcode = 'PQ035',
            message = format('event %s of batch %s is not in the chunk slot %s of consumer %L handed out last',
                             i_msg_id, i_batch, l.sl_slot, l.sl_consumer);
    end if;
    return st;
end;
$$;

-- _fenced_lease(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, msg_id): what the fenced ack and nack check first: their proof
-- is complete (22004), the caller may consume the queue, holds the lease
-- (its token proves it, PQ085 otherwise), and received the chunk it names
-- (_check_delivery). Returns the locked lease.
create or replace function pgque._fenced_lease(i_queue text, i_consumer text, i_slot integer,
                                               i_nslots integer, i_worker text, i_token uuid,
                                               i_epoch bigint, i_batch_id bigint, i_msg_id bigint)
returns pgque.slot_lease language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    if i_epoch is null or i_batch_id is null or i_msg_id is null then
        raise exception using errcode = '22004', message = 'epoch, batch id and msg_id must not be NULL';
    end if;
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    l := pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token);
    perform pgque._check_delivery(l, i_epoch, i_batch_id, i_msg_id);
    return l;
end;
$$;

-- ack_partitioned(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, msg_id): acknowledges the chunk the last receive_partitioned
-- returned, after _check_delivery proved it is the chunk the caller
-- received (epoch and batch_id from its rows, msg_id any of its events).
-- Returns 1 when the batch is finished, 0 when more of it remains.
create or replace function pgque.ack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                 i_nslots integer, i_worker text, i_token uuid,
                                                 i_epoch bigint, i_batch_id bigint, i_msg_id bigint)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    l := pgque._fenced_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token, i_epoch, i_batch_id, i_msg_id);
    return pgque._ack_slot(l, i_slot, i_nslots);
end;
$$;

-- _ack_slot(lease, slot, nslots): the acknowledgement.
create or replace function pgque._ack_slot(l pgque.slot_lease, i_slot integer, i_nslots integer)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch bigint := pgque._slot_batch(l);
    v_done  integer;
begin
    v_done := pgque._ack(v_batch, pgque._slot_filter(i_slot, i_nslots));
    if exists (select 1 from pgque.key_block where kb_sub = l.sl_sub) then
        perform pgque._pause_on_ack(l.sl_sub, v_batch);
    end if;
    return v_done;
end;
$$;

-- nack_partitioned(queue, consumer, slot, nslots, worker, token, epoch,
-- batch_id, msg_id, retry_after, reason): the fenced form: _check_delivery
-- proves msg_id is in the chunk the caller received under epoch. A NULL
-- retry_after dead-letters the event at once, as in the unfenced form.
create or replace function pgque.nack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                  i_nslots integer, i_worker text, i_token uuid,
                                                  i_epoch bigint, i_batch_id bigint, i_msg_id bigint,
                                                  i_retry_after interval, i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    l pgque.slot_lease;
begin
    l := pgque._fenced_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token, i_epoch, i_batch_id, i_msg_id);
    return pgque._nack_slot(l, i_slot, i_nslots, i_msg_id, i_retry_after, i_reason);
end;
$$;

-- nack_partitioned(queue, consumer, slot, nslots, worker, token, msg_id,
-- retry_after, reason): schedules one received event for redelivery to
-- this slot only, or dead-letters it past max_retries. Returns 1 or 0 as
-- nack. The event must be one of this slot's events in the chunk the slot
-- handed out last (PQ022 otherwise); the token ties the call to the
-- current holder, who alone received that chunk.
create or replace function pgque.nack_partitioned(i_queue text, i_consumer text, i_slot integer,
                                                  i_nslots integer, i_worker text, i_token uuid, i_msg_id bigint,
                                                  i_retry_after interval, i_reason text default null)
returns integer language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    return pgque._nack_slot(pgque._hold_lease(i_queue, i_consumer, i_slot, i_nslots, i_worker, i_token),
                            i_slot, i_nslots, i_msg_id, i_retry_after, i_reason);
end;
$$;

-- _nack_slot(lease, slot, nslots, msg_id, retry_after, reason): the nack of
-- both forms.
create or replace function pgque._nack_slot(l pgque.slot_lease, i_slot integer, i_nslots integer,
                                            i_msg_id bigint, i_retry_after interval, i_reason text)
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_batch  bigint := pgque._slot_batch(l);
    v_filter text := pgque._slot_filter(i_slot, i_nslots);
    st       pgque.sub_state := pgque._sub_state(l.sl_sub);
    v_pause  boolean;
    v_key    text;
    v_retried integer;
    c        refcursor := 'pgque_nack_' || v_batch;
begin
    if i_msg_id is null then
        raise exception using errcode = '22004', message = 'msg_id must not be NULL';
    end if;
    select sg_policy = 'pause' into v_pause from pgque.slot_group
     where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer;
    -- Only an event this slot handed out in its current chunk can be
    -- nacked: another slot's event, or one not delivered yet, would get a
    -- retry copy that no consumer ever receives.
    select g.ev_extra1 into v_key
      from pgque.get_batch_cursor(v_batch, c::text, 1,
               concat_ws(' and ', v_filter, 'ev_id = ' || i_msg_id,
                         'ev_id <= ' || coalesce(st.st_delivered_to, -1),
                         'ev_id > ' || coalesce(st.st_acked_to, -1))) g;
    if not found then
        close c;
        raise exception using errcode = 'PQ022',
            message = format('event %s is not in the chunk slot %s handed out last of batch %s', i_msg_id, i_slot, v_batch);
    end if;
    close c;
    v_retried := pgque._event_retry(v_batch, i_msg_id, i_retry_after, i_reason);
    if v_pause then
        perform pgque._pause_on_nack(l, i_nslots, v_batch, i_msg_id, v_key, v_retried = 1, i_reason);
    end if;
    return v_retried;
end;
$$;


-- ==== partition/functions/pgque.partition_slot_status.sql ====
-- _slot_pending(sub_id, slot, nslots): events of one slot committed after
-- its cursor (pending, including retried copies owned by it) and the age of
-- the oldest. The slot predicate is _slot_filter's, so the routing index
-- answers it: the cost is the slot's own backlog, not the stream's.
-- SECURITY DEFINER and granted, because the view below calls it with the
-- caller's privileges.
create or replace function pgque._slot_pending(i_sub integer, i_slot integer, i_nslots integer,
                                               out o_lag bigint, out o_oldest interval)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    s      pgque.subscription;
    v_snap pg_snapshot;
begin
    -- Callable directly by every pgque role: validate what goes into the
    -- statement text (a NULL slot or N would make it a syntax error, N = 0
    -- a division by zero).
    perform pgque._check_slot(i_slot, i_nslots);
    select * into s from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    s := pgque._with_state(s);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    execute 'select count(*), pg_catalog.clock_timestamp() - min(ev_time) from pgque.event'
         || ' where ev_part >= $1 and ev_part < $2 and ev_txid >= $3'
         || ' and not pg_catalog.pg_visible_in_snapshot(ev_txid, $4)'
         || ' and (ev_owner is null or ev_owner = $5)'
         || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '')
       into o_lag, o_oldest
      using s.sub_queue * 16, s.sub_queue * 16 + 16, pg_snapshot_xmin(v_snap), v_snap, s.sub_id;
end;
$$;

-- partition_slot_status: one row per slot: its lease (owner is NULL once the
-- lease expired), epoch, lag (pending events of that slot, not of the whole
-- stream) and the age of its oldest pending event.
select pgque._create_view('partition_slot_status', $ddl$
create or replace view pgque.partition_slot_status as
select q.queue_name      as queue,
       l.sl_consumer     as consumer,
       l.sl_slot         as slot,
       g.sg_nslots       as nslots,
       case when greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp() then l.sl_owner end as owner,
       case when l.sl_owner is not null then greatest(l.sl_until, st.st_time + l.sl_ttl) end as lease_until,
       l.sl_epoch        as epoch,
       p.o_lag           as lag,
       p.o_oldest        as oldest_pending_age,
       g.sg_policy       as policy,
       case when st.st_sub is not null then st.st_batch else s.sub_batch end as open_batch,
       clock_timestamp() - coalesce(st.st_time, s.sub_active) as last_active
  from pgque.slot_lease l
  join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
  join pgque.queue q on q.queue_id = l.sl_queue
  join pgque.subscription s on s.sub_id = l.sl_sub
  left join lateral (select x.st_sub, x.st_batch, x.st_time from pgque.sub_state x
                      where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
  cross join lateral pgque._slot_pending(l.sl_sub, l.sl_slot, g.sg_nslots) p
$ddl$);

-- partition_slot_leases: the slots and their leases only, without the lag
-- (which costs a read of each slot's backlog): cheap enough to poll.
select pgque._create_view('partition_slot_leases', $ddl$
create or replace view pgque.partition_slot_leases as
select q.queue_name  as queue,
       l.sl_consumer as consumer,
       l.sl_slot     as slot,
       g.sg_nslots   as nslots,
       case when greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp() then l.sl_owner end as owner,
       case when l.sl_owner is not null then greatest(l.sl_until, st.st_time + l.sl_ttl) end as lease_until,
       l.sl_epoch    as epoch,
       g.sg_policy   as policy
  from pgque.slot_lease l
  join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
  join pgque.queue q on q.queue_id = l.sl_queue
  left join lateral (select x.st_time from pgque.sub_state x
                      where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
$ddl$);


-- ==== partition/functions/pgque.slot_stalls.sql ====
-- Stalled slots.
--
-- A slot that is subscribed but not worked pins rotation for its whole
-- queue: its cursor holds the oldest event table, and its lag grows. It
-- happens when no live worker claims the slot (every worker is down, or a
-- claim was taken by something that is not a pool and then forgotten) or
-- when the owner keeps its lease alive but stopped consuming (a poll loop
-- stuck on a call, a handler that never returns).
--
-- partition_slot_stalls tells these apart from slow or idle slots with
-- index probes only, whatever the backlog:
--   behind_since   when the slot first had something to consume that it
--                  has not consumed: the time of the first tick after its
--                  cursor (NULL when the cursor is at the queue's newest
--                  tick: nothing to do, nothing pinned)
--   last_progress  when the slot's delivery state last moved (a batch
--                  opened or finished, a chunk handed out or acknowledged);
--                  lease renewals do not count (sub_state.st_moved)
--   stalled_since  the later of the two, while the slot is behind: how long
--                  it has been behind without moving
-- A slot is stalled when stalled_since is older than stall_after: twice
-- the lease ttl (one minute for a slot never claimed). That is past the
-- point where a live pool takes a dead worker's slot over (one ttl, then a
-- claim pass), so 'unclaimed' or 'lease expired' means no live pool with
-- room; a pool whose own loop on the slot is stuck gives it up a little
-- later, at twice the ttl and at least a minute (its watchdog,
-- docs/worker-pool.md). reason says what to do (docs/operations.md):
--   'unclaimed'        nobody holds the lease: no live worker
--   'lease expired'    the last owner stopped renewing and nobody took
--                      over: no live worker
--   'not progressing'  the owner renews its lease but does not consume
-- A healthy slot, however far behind, moves at every chunk, and an idle
-- one is not behind. Tables (read): slot_lease, slot_group, queue,
-- sub_state, tick.
select pgque._create_view('partition_slot_stalls', $ddl$
create or replace view pgque.partition_slot_stalls as
select v.queue, v.consumer, v.slot, v.nslots, v.owner, v.lease_live,
       v.behind_since, v.last_progress, v.stall_after,
       case when v.behind_since is not null then greatest(v.behind_since, v.last_progress) end as stalled_since,
       coalesce(greatest(v.behind_since, v.last_progress) < v.checked_at - v.stall_after
                and v.behind_since is not null, false) as stalled,
       case when not coalesce(greatest(v.behind_since, v.last_progress) < v.checked_at - v.stall_after
                              and v.behind_since is not null, false) then null
            when v.raw_owner is null then 'unclaimed'
            when not v.lease_live then 'lease expired'
            else 'not progressing' end as reason
  from (select q.queue_name                          as queue,
               l.sl_consumer                         as consumer,
               l.sl_slot                             as slot,
               g.sg_nslots                           as nslots,
               l.sl_owner                            as raw_owner,
               case when coalesce(greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp(), false)
                    then l.sl_owner end              as owner,
               l.sl_owner is not null
                 and coalesce(greatest(l.sl_until, st.st_time + l.sl_ttl) > clock_timestamp(), false) as lease_live,
               nt.tick_time                          as behind_since,
               coalesce(st.st_moved, st.st_time)     as last_progress,
               coalesce(2 * l.sl_ttl, interval '1 minute') as stall_after,
               clock_timestamp()                     as checked_at
          from pgque.slot_lease l
          join pgque.slot_group g on g.sg_queue = l.sl_queue and g.sg_consumer = l.sl_consumer
          join pgque.queue q on q.queue_id = l.sl_queue
          left join lateral (select x.st_time, x.st_moved, x.st_last_tick from pgque.sub_state x
                              where x.st_sub = l.sl_sub order by x.st_seq desc limit 1) st on true
          left join lateral (select t.tick_time from pgque.tick t
                              where t.tick_queue = l.sl_queue and t.tick_id > st.st_last_tick
                              order by t.tick_id limit 1) nt on true) v
$ddl$);


-- ==== partition/functions/pgque.key_status.sql ====
-- Per-key visibility: which keys of a consumer have the oldest pending
-- head and why (flowing, in flight, retrying, blocked, held), how a slot's
-- pending work is shared between its keys, and which keys produce the most
-- events right now.
--
-- The functions turn JIT off: their row estimates are guesses (the scans
-- are bounded by budgets the planner cannot see), and compiling a plan
-- costs more than running it. They are VOLATILE and read the cursor from
-- the subscription's state record (_with_state), as every reader of tick
-- and sub_state must (see engine/functions/pgque._state.sql).
--
-- Nothing here is written per event: every answer is computed when asked,
-- from the log itself, with bounded scans. A slot's pending events are read
-- through the routing index ((hash expr), ev_txid, ev_id) in ev_txid order, so the
-- first rows read are the oldest pending ones; the scan stops after a
-- budget of rows, and then the counts are lower bounds (estimated = true)
-- while the heads found are still the oldest ones.

-- _slot_keys(sub_id, slot, nslots, scan): the pending events of one slot
-- (the same visibility as _slot_pending: committed after the cursor's tick,
-- retried copies owned by the slot included), at most i_scan of them in
-- ev_txid order, grouped by key. Per key: its head ev_id and time, how many
-- of its events were seen, how many of those are in the slot's open batch;
-- and for the slot: how many rows were read and whether the budget cut the
-- scan short. The caller validates i_scan; the statement text holds
-- validated integers only.
create or replace function pgque._slot_keys(i_sub integer, i_slot integer, i_nslots integer, i_scan integer)
returns table (key text, head_ev_id bigint, head_time timestamptz, pending bigint, in_batch bigint,
               scanned bigint, truncated boolean)
language plpgsql volatile rows 100
set search_path = pg_catalog, pg_temp
-- Only a walk of the routing index in ev_txid order stops after the budget:
-- a slot's events are spread over every heap page, so the bitmap scan and
-- sort the planner may prefer for a large budget read the whole table.
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    s      pgque.subscription;
    v_snap pg_snapshot;
    v_next pg_snapshot;
begin
    perform pgque._check_slot(i_slot, i_nslots);
    select * into s from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    s := pgque._with_state(s);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    if s.sub_next_tick is not null then
        select tick_snapshot into v_next from pgque.tick where tick_queue = s.sub_queue and tick_id = s.sub_next_tick;
    end if;
    return query execute
        'with e as (select ev_id, ev_time, ev_txid, ev_extra1 from pgque.event'
     || ' where ev_part >= $1 and ev_part < $2 and ev_txid >= $3'
     || ' and not pg_catalog.pg_visible_in_snapshot(ev_txid, $4)'
     || ' and (ev_owner is null or ev_owner = $5)'
     || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '')
     || ' order by ev_txid limit $7)'
     || ' select ev_extra1, min(ev_id), min(ev_time), count(*),'
     || ' count(*) filter (where $6::pg_snapshot is not null and pg_catalog.pg_visible_in_snapshot(ev_txid, $6)),'
     || ' (sum(count(*)) over ())::bigint, (sum(count(*)) over ()) >= $7'
     || ' from e group by ev_extra1'
      using s.sub_queue * 16, s.sub_queue * 16 + 16, pg_snapshot_xmin(v_snap), v_snap, s.sub_id, v_next, i_scan;
end;
$$;

-- _key_scan_args(limit, scan): validates the row limits of the key views
-- (PQ011 outside their range, 22004 for NULL).
create or replace function pgque._key_scan_args(i_limit integer, i_scan integer)
returns void language plpgsql immutable
set search_path = pg_catalog, pg_temp
as $$
begin
    if i_limit is null or i_scan is null then
        raise exception using errcode = '22004', message = 'limit and scan must not be NULL';
    end if;
    if i_limit < 1 or i_limit > 10000 then
        raise exception using errcode = 'PQ011', message = format('limit must be between 1 and 10000, not %s', i_limit);
    end if;
    if i_scan < 1 or i_scan > 100000000 then
        raise exception using errcode = 'PQ011', message = format('scan must be between 1 and 100000000, not %s', i_scan);
    end if;
end;
$$;

-- _key_slots(queue, consumer, slot): the slot group and the chosen slots
-- of a consumer (all when i_slot is NULL). Raises PQ001 for a missing
-- queue, PQ034 when the consumer has no slots, PQ011 for a slot out of
-- range.
create or replace function pgque._key_slots(i_queue text, i_consumer text, i_slot integer)
returns setof pgque.slot_lease language plpgsql volatile rows 16
set search_path = pg_catalog, pg_temp
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
    g pgque.slot_group;
begin
    select * into g from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer;
    if not found then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L', i_consumer, i_queue);
    end if;
    if i_slot is not null then
        perform pgque._check_slot(i_slot, g.sg_nslots);
    end if;
    return query select l.* from pgque.slot_lease l
                  where l.sl_queue = q.queue_id and l.sl_consumer = i_consumer
                    and (i_slot is null or l.sl_slot = i_slot)
                  order by l.sl_slot;
end;
$$;

-- key_heads(queue, consumer, slot, limit, scan): the keys of a consumer
-- (one slot, or all when slot is NULL) with the oldest pending head, oldest
-- first, at most i_limit rows. Per key: slot, key (NULL and '' are distinct
-- keys), state, head ev_id and age, pending events (log + retry + deferred),
-- and for failing keys the failures, last reason, when the retry is due and
-- how many events are deferred behind the head. State is, in this order of
-- precedence: 'blocked' (pause policy: the head failed and waits for its
-- retry; every later event is deferred), 'held' (pause policy: the head was
-- settled and the deferred events are being put back), 'retrying' (an
-- event of the key waits in the retry queue), 'in flight' (the head is in
-- the slot's open batch, or the key is held while its lane runs it),
-- 'flowing'. At most i_scan pending log rows are
-- read in all, split evenly between the slots; estimated is true for a
-- slot whose scan was cut short (its counts are then lower bounds).
-- Reads subscription, tick, slot_group, slot_lease, event, retry_queue,
-- deferred, key_block.
create or replace function pgque.key_heads(i_queue text, i_consumer text, i_slot integer default null,
                                           i_limit integer default 20, i_scan integer default 20000)
returns table (slot integer, key text, state text, head_ev_id bigint, head_age interval, pending bigint,
               failures integer, reason text, retry_at timestamptz, deferred bigint, estimated boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_slots integer;
    v_budget integer;
    v_nslots integer;
    v_now    timestamptz := clock_timestamp();
begin
    perform pgque._key_scan_args(i_limit, i_scan);
    select count(*)::integer into v_slots from pgque._key_slots(i_queue, i_consumer, i_slot);
    select g.sg_nslots into v_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    v_budget := greatest(1, i_scan / greatest(v_slots, 1));
    -- One row per (slot, key) and source (log, retry queue, deferred),
    -- folded by grouping rather than joined: the sources have no
    -- statistics, and a join of two large ones would loop. kid spells the
    -- key with NULL distinct, as key_block does (_kid, inlined).
    return query
    with sl as (select * from pgque._key_slots(i_queue, i_consumer, i_slot)),
    src as (
        select sl.sl_slot, case when x.key is null then 'n' else 'k' || x.key end as kid, x.key,
               x.head_ev_id, x.head_time, x.pending, x.in_batch > 0 as in_batch, false as retrying,
               null::timestamptz as retry_at, 0::bigint as deferred, x.truncated
          from sl cross join lateral pgque._slot_keys(sl.sl_sub, sl.sl_slot, v_nslots, v_budget) x
        union all
        select sl.sl_slot, case when rq.ev_extra1 is null then 'n' else 'k' || rq.ev_extra1 end, rq.ev_extra1,
               min(rq.ev_id), min(rq.ev_time), count(*), false, true, min(rq.ev_retry_after), 0, false
          from sl join pgque.retry_queue rq on rq.ev_owner = sl.sl_sub
         group by 1, 2, 3
        union all
        select sl.sl_slot, de.ev_group, min(de.ev_extra1), min(de.ev_id), min(de.ev_time), count(*), false, false,
               null, count(*), false
          from sl join pgque.deferred de on de.ev_owner = sl.sl_sub
         group by 1, 2),
    est as (select src.sl_slot, bool_or(src.truncated) as truncated from src group by 1),
    j as (select src.sl_slot, src.kid, min(src.key) as key, min(src.head_ev_id) as head_ev_id,
                 min(src.head_time) as head_time, sum(src.pending)::bigint as pending,
                 bool_or(src.in_batch) as in_batch, bool_or(src.retrying) as retrying,
                 min(src.retry_at) as retry_at, sum(src.deferred)::bigint as deferred
            from src group by 1, 2)
    select j.sl_slot, j.key,
           case when b.kb_state = 'blocked' then 'blocked'
                when b.kb_state = 'releasing' then 'held'
                when b.kb_state = 'inflight' then 'in flight'
                when j.retrying then 'retrying'
                when j.in_batch then 'in flight'
                else 'flowing' end,
           j.head_ev_id, v_now - j.head_time, j.pending,
           b.kb_failures, b.kb_reason, j.retry_at, j.deferred,
           coalesce(est.truncated, false)
      from j
      left join est on est.sl_slot = j.sl_slot
      left join (select sl.sl_slot, kb.* from sl join pgque.key_block kb on kb.kb_sub = sl.sl_sub) b
        on b.sl_slot = j.sl_slot and b.kb_kid = j.kid
     order by j.head_time nulls last, j.head_ev_id
     limit i_limit;
end;
$$;

-- key_shares(queue, consumer, scan): per slot of a consumer, how many
-- events are pending (from a scan of at most i_scan rows in all, split
-- between the slots; estimated when cut short), the key holding most of
-- them and its share (0..1). A share near 1 on a slot with a large backlog
-- is a hot key: the slot cannot go faster than that key's handler. Reads
-- subscription, tick, slot_group, slot_lease, event.
create or replace function pgque.key_shares(i_queue text, i_consumer text, i_scan integer default 20000)
returns table (slot integer, pending bigint, top_key text, top_pending bigint, share double precision,
               keys bigint, estimated boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_slots integer;
    v_nslots integer;
begin
    perform pgque._key_scan_args(1, i_scan);
    select count(*)::integer into v_slots from pgque._key_slots(i_queue, i_consumer, null);
    select g.sg_nslots into v_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    return query
    select sl.sl_slot, coalesce(max(x.scanned), 0)::bigint,
           (array_agg(x.key order by x.pending desc, x.head_ev_id))[1],
           coalesce(max(x.pending), 0)::bigint,
           case when coalesce(max(x.scanned), 0) = 0 then 0::double precision
                else max(x.pending)::double precision / max(x.scanned) end,
           count(x.head_ev_id), coalesce(bool_or(x.truncated), false)
      from pgque._key_slots(i_queue, i_consumer, null) sl
      left join lateral pgque._slot_keys(sl.sl_sub, sl.sl_slot, v_nslots, greatest(1, i_scan / greatest(v_slots, 1))) x
        on true
     group by sl.sl_slot
     order by sl.sl_slot;
end;
$$;

-- hot_keys(queue, window, limit, sample): the keys that produced the most
-- events in the last i_window (new events only, not retried copies), at
-- most i_limit, busiest first: events, rate per second and share of the
-- window's events. At most i_sample of the newest events are read (through
-- the ev_txid index, newest first); when the window holds more, the window
-- is shortened to the span the sample covers and estimated is true.
-- Reads event.
create or replace function pgque.hot_keys(i_queue text, i_window interval default '1 minute',
                                          i_limit integer default 10, i_sample integer default 20000)
returns table (key text, events bigint, rate double precision, share double precision,
               span interval, estimated boolean)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    q pgque.queue := pgque._queue(i_queue);
begin
    perform pgque._key_scan_args(i_limit, i_sample);
    if i_window is null then
        raise exception using errcode = '22004', message = 'window must not be NULL';
    end if;
    if i_window <= interval '0' or i_window > interval '1 day' then
        raise exception using errcode = 'PQ011',
            message = format('window must be more than 0 and at most 1 day, not %s', i_window);
    end if;
    return query
    with e as (select ev.ev_time, ev.ev_extra1 from pgque.event ev
                where ev.ev_part >= q.queue_id * 16 and ev.ev_part < q.queue_id * 16 + 16
                  and ev.ev_owner is null
                order by ev.ev_txid desc limit i_sample),
    w as (select * from e where e.ev_time >= clock_timestamp() - i_window),
    t as (select count(*) as n, count(*) >= i_sample as cut,
                 case when count(*) >= i_sample then clock_timestamp() - min(w.ev_time) else i_window end as span
            from w)
    select w.ev_extra1, count(*),
           count(*) / greatest(extract(epoch from t.span), 0.001)::double precision,
           count(*)::double precision / t.n, t.span, t.cut
      from w cross join t
     group by w.ev_extra1, t.n, t.span, t.cut
     order by count(*) desc, w.ev_extra1 nulls first
     limit i_limit;
end;
$$;

-- _slot_head(sub_id, slot, nslots): the first pending event of one slot in
-- ev_txid order (its ev_id and ev_time), NULL when nothing is pending. Pending
-- is what _slot_pending counts, spelled so that an index probe answers it:
-- an event is not visible in the cursor's snapshot exactly when its
-- transaction is at or after the snapshot's xmax, or was in progress at the
-- tick (the snapshot's xip list). Two probes of the routing index, so the
-- cost does not grow with the backlog.
create or replace function pgque._slot_head(i_sub integer, i_slot integer, i_nslots integer,
                                            out o_ev_id bigint, out o_time timestamptz)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
set enable_bitmapscan = off
as $$
declare
    s      pgque.subscription;
    v_snap pg_snapshot;
    v_from text;
begin
    perform pgque._check_slot(i_slot, i_nslots);
    select * into s from pgque.subscription where sub_id = i_sub;
    if not found then
        return;
    end if;
    s := pgque._with_state(s);
    select tick_snapshot into v_snap from pgque.tick where tick_queue = s.sub_queue and tick_id = s.sub_last_tick;
    v_from := 'select ev_id, ev_time, ev_txid from pgque.event where ev_part >= $1 and ev_part < $2'
           || ' and (ev_owner is null or ev_owner = $5)'
           || coalesce(' and ' || pgque._slot_filter(i_slot, i_nslots), '');
    -- The running transactions are probed one by one (each an equality on
    -- the index's ev_txid): "ev_txid = any(list) order by ev_txid" is no
    -- index range before PostgreSQL 17, and would scan the slot's whole
    -- index in order.
    execute 'select ev_id, ev_time from ('
         || '(' || v_from || ' and ev_txid >= $3 order by ev_txid limit 1)'
         || ' union all (select e.ev_id, e.ev_time, e.ev_txid from pg_catalog.unnest($4) x(xid)'
         || ' cross join lateral (' || v_from || ' and ev_txid = x.xid limit 1) e)'
         || ') h order by ev_txid limit 1'
       into o_ev_id, o_time
      using s.sub_queue * 16, s.sub_queue * 16 + 16, pg_snapshot_xmax(v_snap),
            array(select pg_snapshot_xip(v_snap)), s.sub_id;
end;
$$;

-- slot_heads(queue, consumer): per slot of a consumer, the first pending
-- event in ev_txid order and its age (NULL when the slot is caught up).
-- Cheap whatever the backlog (two index probes per slot), so the worker
-- pool reads it on every claim pass to claim the most behind free slot
-- first. Reads slot_group, slot_lease, subscription, tick, event.
create or replace function pgque.slot_heads(i_queue text, i_consumer text)
returns table (slot integer, head_ev_id bigint, head_age interval)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
set jit = off
as $$
declare
    v_nslots integer;
    -- One clock reading for every slot, so that ages compare exactly.
    v_now    timestamptz := clock_timestamp();
begin
    select g.sg_nslots into v_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    return query
    select sl.sl_slot, h.o_ev_id, v_now - h.o_time
      from pgque._key_slots(i_queue, i_consumer, null) sl
     cross join lateral pgque._slot_head(sl.sl_sub, sl.sl_slot, v_nslots) h
     order by sl.sl_slot;
end;
$$;


-- ==== partition/functions/pgque.announce_worker.sql ====
-- announce_worker(queue, consumer, worker, hungry, slots, max_age): records
-- that worker of the partitioned consumer is alive, works slots and is (or
-- is not) hungry, and returns the other workers heard from within max_age
-- (at most 10 minutes), each with its newest announcement and how long ago
-- it was made. The consumer must have slots (PQ034); worker is 1 to 200
-- bytes and slots at most 1024 entries (PQ011). Workers not heard from for
-- 10 minutes are forgotten by the next presence flip.
-- Tables: worker_presence (insert, read), slot_group (read).
create or replace function pgque.announce_worker(i_queue text, i_consumer text, i_worker text, i_hungry boolean,
                                                 i_slots integer[], i_max_age interval)
returns table (worker text, hungry boolean, slots integer[], age interval)
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q     pgque.queue := pgque._queue(i_queue);
    v_now timestamptz := clock_timestamp();
    v_age interval;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    perform pgque._check_consumer(i_consumer);
    if i_worker is null or i_hungry is null or i_slots is null then
        raise exception using errcode = '22004', message = 'worker, hungry and slots must not be NULL';
    end if;
    if i_worker = '' or octet_length(i_worker) > 200 then
        raise exception using errcode = 'PQ011',
            message = format('worker id must be 1 to 200 bytes, not %s', octet_length(i_worker));
    end if;
    if cardinality(i_slots) > 1024 then
        raise exception using errcode = 'PQ011', message = format('at most 1024 slots, not %s', cardinality(i_slots));
    end if;
    v_age := pgque._check_interval('max age', coalesce(i_max_age, interval '10 minutes'), interval '0', interval '10 minutes');
    if not exists (select 1 from pgque.slot_group where sg_queue = q.queue_id and sg_consumer = i_consumer) then
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
    insert into pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_hungry, wp_slots, wp_seen)
    values (q.queue_id, i_consumer, i_worker, i_hungry, i_slots, v_now);
    -- The consumer's distinct workers by a skip scan of the index (one probe
    -- per worker, however many records each has), then each one's newest
    -- record.
    return query
        with recursive w (wid) as (
            (select p.wp_worker from pgque.worker_presence p
              where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer
              order by p.wp_worker limit 1)
            union all
            select (select p.wp_worker from pgque.worker_presence p
                     where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer and p.wp_worker > w.wid
                     order by p.wp_worker limit 1)
              from w where w.wid is not null
        )
        select r.wp_worker, r.wp_hungry, r.wp_slots, v_now - r.wp_seen
          from w
         cross join lateral (select p.* from pgque.worker_presence p
                              where p.wp_queue = q.queue_id and p.wp_consumer = i_consumer and p.wp_worker = w.wid
                              order by p.wp_seen desc limit 1) r
         where w.wid is not null and w.wid <> i_worker and r.wp_seen >= v_now - v_age
         order by r.wp_worker;
end;
$$;

-- _presence_keep(gen): the newest record of every worker heard from in the
-- last 10 minutes whose consumer still has slots, when it lives in
-- partition gen.
create or replace function pgque._presence_keep(i_gen integer)
returns setof pgque.worker_presence language sql volatile
set search_path = pg_catalog, pg_temp
as $$
    select distinct on (p.wp_queue, p.wp_consumer, p.wp_worker) p.*
      from pgque.worker_presence p
     where p.wp_seen >= clock_timestamp() - interval '10 minutes'
       and exists (select 1 from pgque.slot_group g where g.sg_queue = p.wp_queue and g.sg_consumer = p.wp_consumer)
     order by p.wp_queue, p.wp_consumer, p.wp_worker, p.wp_seen desc
$$;

-- _presence_flip(): retires the current presence generation, keeping each
-- live worker's newest record (see structure/presence.sql). Skipped when
-- the current generation holds nothing else. Waits at most 200 ms for the
-- retired partition's lock and otherwise tries again at the next maint().
-- Returns 1 when flipped. Not granted: maint() calls it as a layer hook.
-- Tables: presence_rotation (lock), worker_presence (insert, truncate).
create or replace function pgque._presence_flip()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    v_cur integer;
begin
    perform 1 from pgque.presence_rotation for update skip locked;
    if not found then
        return 0;
    end if;
    v_cur := pgque._presence_gen();
    if (select count(*) from pgque.worker_presence where wp_gen = v_cur)
       <= (select count(*) from pgque._presence_keep(v_cur) k where k.wp_gen = v_cur) then
        return 0;
    end if;
    if not pgque._flip_lock('pgque.worker_presence_' || v_cur) then
        return 0;
    end if;
    perform nextval('pgque.presence_gen_seq');
    insert into pgque.worker_presence (wp_queue, wp_consumer, wp_worker, wp_hungry, wp_slots, wp_seen, wp_gen)
    select k.wp_queue, k.wp_consumer, k.wp_worker, k.wp_hungry, k.wp_slots, k.wp_seen, 1 - v_cur
      from pgque._presence_keep(v_cur) k
     where k.wp_gen = v_cur;
    execute format('truncate %s', 'pgque.worker_presence_' || v_cur);
    return 1;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'presence_flip', 'pgque._presence_flip()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;


-- ==== partition/functions/pgque.resize_slots.sql ====
-- Online resize of a slot group: N old slots hand over to M new ones while
-- producers send and workers consume, keeping G1 and G2 across the change.
--
--   resize_slots          seal tick S made; old slots sealed at S (their
--        │                batches end there); M new subscriptions start at
--        ▼                S, with no lease yet, so nobody can work them
--   draining ───────────  old slots consume up to S; held lanes settle
--        │                (every old cursor at S, no batch open, no key
--        ▼                 held inflight)
--   cutover (one txn) ──  retries, deferred events, blocked/releasing keys
--        │                and owned events in the log after S move to the
--        │                new slot of their key; dead letters are renamed;
--        ▼                old subscriptions dropped; new leases created
--   done                  N = M; workers learn it from PQ030 / the group
--
-- Every event visible in S's snapshot belongs to an old slot, every later
-- one to a new slot; a new slot gets no lease before every old one is done,
-- so no key is handled by an old and a new slot at once, and a key's state
-- that outlives its old slot (a retry, a blocked head and its deferred
-- events, events put back after S) is carried to its new slot, where the
-- key's block row keeps later events behind it exactly as on the old slot.
-- The cutover is attempted by every empty receive of an old slot and by
-- maint(), so no step is manual and a crash only delays it.

-- _resize_group(queue_id, consumer): the slot group, locked, or PQ071.
create or replace function pgque._resize_group(i_queue text, i_consumer text)
returns pgque.slot_group language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    g pgque.slot_group;
begin
    select g1.* into g from pgque.slot_group g1 join pgque.queue q on q.queue_id = g1.sg_queue
     where q.queue_name = i_queue and g1.sg_consumer = i_consumer
       for update of g1;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ071',
            message = format('consumer %L has no slots on queue %L; nothing to resize', i_consumer, i_queue);
    end if;
    return g;
end;
$$;

-- resize_slots(queue, consumer, new_nslots): starts an online resize of the
-- consumer's slots to new_nslots. Makes the seal tick, seals the old slots'
-- subscriptions there and registers the new slots' subscriptions at it
-- (without leases). Workers keep working; the cutover happens by itself
-- once the old slots are done. Raises PQ071 for a consumer without slots,
-- PQ070 when a resize is already in progress, PQ072 when new_nslots is the
-- current N, PQ051 when the queue would need a fifth distinct N, PQ074 when
-- a subscription of a new slot exists already, PQ011/22004 for a bad N.
-- Returns the seal tick. Tables: slot_group, subscription, tick, sub_state.
create or replace function pgque.resize_slots(i_queue text, i_consumer text, i_new_nslots integer)
returns bigint language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    q      pgque.queue;
    g      pgque.slot_group;
    v_seal bigint;
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    q := pgque._queue(i_queue);
    perform pgque._check_consumer(i_consumer);
    if i_new_nslots is null then
        raise exception using errcode = '22004', message = 'new nslots must not be NULL';
    end if;
    perform pgque._check_slot(0, i_new_nslots);
    g := pgque._resize_group(i_queue, i_consumer);
    if g.sg_resize_to is not null then
        raise exception using errcode = 'PQ070',
            message = format('consumer %L on queue %L is already being resized from %s to %s slots (since %s)',
                             i_consumer, i_queue, g.sg_nslots, g.sg_resize_to, g.sg_resize_started);
    end if;
    if g.sg_nslots = i_new_nslots then
        raise exception using errcode = 'PQ072',
            message = format('consumer %L on queue %L already has %s slots', i_consumer, i_queue, i_new_nslots);
    end if;
    update pgque.slot_group set sg_resize_to = i_new_nslots, sg_resize_started = clock_timestamp()
     where sg_queue = q.queue_id and sg_consumer = i_consumer;

    -- The seal tick: made here, under the queue row's lock (kept until
    -- commit), so it is the latest tick when the new slots register below.
    v_seal := pgque._tick(q.queue_id, true);
    update pgque.subscription s set sub_until_tick = v_seal
      from pgque.slot_lease l
     where l.sl_queue = q.queue_id and l.sl_consumer = i_consumer and s.sub_id = l.sl_sub;
    for v_slot in 0 .. i_new_nslots - 1 loop
        if pgque.register_consumer(i_queue, pgque._slot_name(i_consumer, v_slot, i_new_nslots)) = 0 then
            raise exception using errcode = 'PQ074',
                message = format('subscription %L exists already; unsubscribe it before resizing to %s slots',
                                 pgque._slot_name(i_consumer, v_slot, i_new_nslots), i_new_nslots);
        end if;
    end loop;
    update pgque.slot_group set sg_seal_tick = v_seal
     where sg_queue = q.queue_id and sg_consumer = i_consumer;
    perform pgque._make_reader(q.queue_id, i_new_nslots, false); -- see api/functions/pgque.deliver_raw.sql
    -- Last: building a routing index holds a SHARE lock on an event table
    -- to the end of the transaction, and nothing may be waited for after
    -- it (sealing waits for the old slots' receive locks, whose holders
    -- may insert events).
    perform pgque._route_index(q.queue_id, i_new_nslots, true);
    return v_seal;
end;
$$;

-- _resize_drained(queue_id, consumer, seal): how many old slots are done
-- (cursor at the seal, no batch open) and how many keys are still held
-- by a running lane on them.
create or replace function pgque._resize_drained(i_queue_id integer, i_consumer text, i_seal bigint,
                                                 out o_total integer, out o_done integer, out o_held integer)
language plpgsql volatile
set search_path = pg_catalog, pg_temp
as $$
begin
    select count(*), count(*) filter (where st.st_batch is null and st.st_last_tick >= i_seal)
      into o_total, o_done
      from pgque.slot_lease l cross join lateral pgque._sub_state(l.sl_sub) st
     where l.sl_queue = i_queue_id and l.sl_consumer = i_consumer;
    select count(*) into o_held
      from pgque.key_block kb join pgque.slot_lease l on l.sl_sub = kb.kb_sub
     where l.sl_queue = i_queue_id and l.sl_consumer = i_consumer and kb.kb_state = 'inflight';
end;
$$;

-- _resize_try(queue_id, consumer): completes the group's resize when every
-- old slot is done. Never waits for another cutover attempt (the group row
-- is taken with SKIP LOCKED) and waits at most 200 ms for the old slots'
-- lease rows (their owners' calls are short). Returns true when the
-- cutover happened here. Tables: slot_group, slot_lease, subscription,
-- retry_queue, deferred, key_block, event, dead_letter.
create or replace function pgque._resize_try(i_queue_id integer, i_consumer text)
returns boolean language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    g        pgque.slot_group;
    d        record;
    v_old_lt text := current_setting('lock_timeout');
begin
    select * into g from pgque.slot_group
     where sg_queue = i_queue_id and sg_consumer = i_consumer and sg_resize_to is not null
       for update skip locked;
    if not found or g.sg_seal_tick is null then
        return false;
    end if;
    d := pgque._resize_drained(i_queue_id, i_consumer, g.sg_seal_tick);
    if d.o_done < d.o_total or d.o_held > 0 then
        return false;
    end if;
    begin
        perform set_config('lock_timeout', '200ms', true);
        perform 1 from pgque.slot_lease where sl_queue = i_queue_id and sl_consumer = i_consumer
         order by sl_slot for update;
        perform set_config('lock_timeout', v_old_lt, true);
    exception when lock_not_available then
        perform set_config('lock_timeout', v_old_lt, true);
        return false;
    end;
    -- Under the leases nothing of the old slots moves any more: check again.
    d := pgque._resize_drained(i_queue_id, i_consumer, g.sg_seal_tick);
    if d.o_done < d.o_total or d.o_held > 0 then
        return false;
    end if;
    perform pgque._resize_cutover(g);
    return true;
end;
$$;

-- _resize_cutover(group): the cutover, with the group and every old lease
-- row locked and every old slot done. Moves what outlives the old slots to
-- the new slot of each key, in an order that lets every concurrent writer
-- of those rows finish first: key blocks (operators' unblock_key and
-- retry_key_now lock them), retries (maint_retry_events deletes them),
-- deferred events, then the old slots' own events in the log after the
-- seal, read last with a fresh snapshot. Then drops the old subscriptions,
-- creates the new leases (epochs above every old one) and sets N.
create or replace function pgque._resize_cutover(g pgque.slot_group)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    q       pgque.queue;
    v_old   integer[];
    v_names text[];
    v_new   integer[];
    v_m     integer := g.sg_resize_to;
    v_snap  pg_snapshot;
    v_epoch bigint;
    v_n     integer;
begin
    select * into q from pgque.queue where queue_id = g.sg_queue;
    select array_agg(l.sl_sub order by l.sl_slot), array_agg(s.sub_name order by l.sl_slot), max(l.sl_epoch)
      into v_old, v_names, v_epoch
      from pgque.slot_lease l join pgque.subscription s on s.sub_id = l.sl_sub
     where l.sl_queue = g.sg_queue and l.sl_consumer = g.sg_consumer;
    select array_agg(s.sub_id order by k) into v_new
      from generate_series(0, v_m - 1) k
      join pgque.subscription s on s.sub_queue = g.sg_queue
                               and s.sub_name = pgque._slot_name(g.sg_consumer, k, v_m);
    if cardinality(v_new) is distinct from v_m then
        raise exception using errcode = 'PQ074',
            message = format('the subscriptions of the %s new slots of consumer %L are incomplete', v_m, g.sg_consumer);
    end if;
    select tick_snapshot into v_snap from pgque.tick where tick_queue = g.sg_queue and tick_id = g.sg_seal_tick;

    with moved as (
        delete from pgque.key_block kb where kb.kb_sub = any(v_old) returning kb.*
    )
    insert into pgque.key_block (kb_sub, kb_kid, kb_key, kb_state, kb_head, kb_wait, kb_wait_batch,
                                 kb_since, kb_failures, kb_reason, kb_epoch)
    select v_new[pgque.slot_of(m.kb_key, v_m) + 1], m.kb_kid, m.kb_key, m.kb_state, m.kb_head, m.kb_wait, null,
           m.kb_since, m.kb_failures, m.kb_reason, null
      from moved m;

    with moved as (
        delete from pgque.retry_queue r where r.ev_owner = any(v_old) returning r.*
    )
    insert into pgque.retry_queue (ev_owner, ev_id, ev_queue, ev_retry_after, ev_time, ev_retry,
                                   ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    select v_new[pgque.slot_of(m.ev_extra1, v_m) + 1], m.ev_id, m.ev_queue, m.ev_retry_after, m.ev_time, m.ev_retry,
           m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4
      from moved m
    on conflict (ev_owner, ev_id) do nothing;

    with moved as (
        delete from pgque.deferred d where d.ev_owner = any(v_old) returning d.*
    )
    insert into pgque.deferred (ev_owner, ev_id, ev_group, ev_queue, ev_time, ev_retry, ev_type, ev_data,
                                ev_extra1, ev_extra2, ev_extra3, ev_extra4, deferred_at)
    select v_new[pgque.slot_of(m.ev_extra1, v_m) + 1], m.ev_id, m.ev_group, m.ev_queue, m.ev_time, m.ev_retry,
           m.ev_type, m.ev_data, m.ev_extra1, m.ev_extra2, m.ev_extra3, m.ev_extra4, m.deferred_at
      from moved m
    on conflict (ev_owner, ev_id) do nothing;

    -- Events only an old slot sees (retries and released events put into
    -- the log after the seal): a copy for the key's new slot. The old
    -- copies stay in the log, seen by nobody, until rotation.
    insert into pgque.event (ev_id, ev_time, ev_part, ev_owner, ev_retry, ev_type, ev_data,
                             ev_extra1, ev_extra2, ev_extra3, ev_extra4)
    select e.ev_id, e.ev_time, q.queue_id * 16 + q.queue_cur_table, v_new[pgque.slot_of(e.ev_extra1, v_m) + 1],
           e.ev_retry, e.ev_type, e.ev_data, e.ev_extra1, e.ev_extra2, e.ev_extra3, e.ev_extra4
      from pgque.event e
     where e.ev_part >= q.queue_id * 16 and e.ev_part < q.queue_id * 16 + 16
       and e.ev_owner = any(v_old)
       and e.ev_txid >= pg_snapshot_xmin(v_snap) and not pg_visible_in_snapshot(e.ev_txid, v_snap)
     order by e.ev_id;
    get diagnostics v_n = row_count;
    if v_n > 0 then
        perform nextval(q.queue_event_seq);
    end if;

    -- Dead letters name the slot they failed on; rename them to the key's
    -- new slot, so dlq_replay finds a subscription.
    update pgque.dead_letter dl
       set dl_consumer = pgque._slot_name(g.sg_consumer, pgque.slot_of(dl.ev_extra1, v_m), v_m)
     where dl.dl_queue = g.sg_queue and dl.dl_consumer = any(v_names);

    delete from pgque.subscription where sub_id = any(v_old);
    insert into pgque.slot_lease (sl_queue, sl_consumer, sl_slot, sl_sub, sl_epoch)
    select g.sg_queue, g.sg_consumer, k - 1, v_new[k], coalesce(v_epoch, 0) + 1
      from generate_subscripts(v_new, 1) k;
    update pgque.slot_group
       set sg_past_nslots = array_append(array_remove(sg_past_nslots, sg_nslots), sg_nslots),
           sg_nslots = v_m, sg_resize_to = null, sg_seal_tick = null, sg_resized_at = clock_timestamp()
     where sg_queue = g.sg_queue and sg_consumer = g.sg_consumer;
    -- Wake the workers: their next call on an old slot fails with PQ030 and
    -- they take up the new N.
    if pg_notification_queue_usage() < 0.5 then
        perform pg_notify('pgque', pgque._tick_tag(q.queue_name));
    end if;
end;
$$;

-- _resize_poll(lease): called by an old slot's receive that found nothing:
-- attempts the cutover when the slot's group is being resized.
create or replace function pgque._resize_poll(l pgque.slot_lease)
returns void language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
    if exists (select 1 from pgque.slot_group where sg_queue = l.sl_queue and sg_consumer = l.sl_consumer
                                                 and sg_resize_to is not null) then
        perform pgque._resize_try(l.sl_queue, l.sl_consumer);
    end if;
end;
$$;

-- _maint_resize(): the maint() hook: attempts the cutover of every group
-- being resized. Returns how many completed.
create or replace function pgque._maint_resize()
returns integer language plpgsql
set search_path = pg_catalog, pg_temp
as $$
declare
    r   record;
    v_n integer := 0;
begin
    for r in select sg_queue, sg_consumer from pgque.slot_group where sg_resize_to is not null
              order by sg_queue, sg_consumer loop
        if pgque._resize_try(r.sg_queue, r.sg_consumer) then
            v_n := v_n + 1;
        end if;
    end loop;
    return v_n;
end;
$$;

insert into pgque.layer_hook (hook_kind, hook_name, hook_fn) values
    ('maint', 'slot_resize', 'pgque._maint_resize()')
on conflict (hook_kind, hook_name) do update set hook_fn = excluded.hook_fn;

-- slot_group_info(queue, consumer): the consumer's N, failure policy and
-- resize state: the target N while a resize is in progress (NULL
-- otherwise) and every N it had before. What a worker pool reads to follow
-- a resize. PQ034 when the consumer has no slots.
create or replace function pgque.slot_group_info(i_queue text, i_consumer text)
returns table (nslots integer, policy text, resize_to integer, past_nslots integer[])
language plpgsql security definer
set search_path = pg_catalog, pg_temp
as $$
begin
    perform pgque._authorize(i_queue, i_consumer, 'consume'); -- access check
    return query
    select g.sg_nslots, g.sg_policy, g.sg_resize_to, g.sg_past_nslots
      from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
     where q.queue_name = i_queue and g.sg_consumer = i_consumer;
    if not found then
        perform pgque._queue(i_queue);
        raise exception using errcode = 'PQ034',
            message = format('consumer %L has no slots on queue %L; call subscribe_slot first', i_consumer, i_queue);
    end if;
end;
$$;

-- resize_status(queue): the resizes of a queue's consumers (of every
-- queue when NULL): in progress (phase draining while old slots still
-- consume up to the seal, settling while held lanes finish, cutover when
-- it is due at the next empty receive or maint()) and the last completed
-- one (phase done).
create or replace function pgque.resize_status(i_queue text default null)
returns table (queue text, consumer text, nslots integer, resize_to integer, phase text, seal_tick bigint,
               started timestamptz, finished timestamptz, slots_done integer, slots_total integer,
               held_keys integer, blocked_keys integer)
language plpgsql volatile security definer
set search_path = pg_catalog, pg_temp
as $$
declare
    r record;
    d record;
begin
    if i_queue is not null then
        perform pgque._queue(i_queue);
    end if;
    for r in select q.queue_name, q.queue_id, g.*
               from pgque.slot_group g join pgque.queue q on q.queue_id = g.sg_queue
              where (i_queue is null or q.queue_name = i_queue)
                and (g.sg_resize_to is not null or g.sg_resized_at is not null)
              order by q.queue_name, g.sg_consumer loop
        queue := r.queue_name;
        consumer := r.sg_consumer;
        nslots := r.sg_nslots;
        resize_to := r.sg_resize_to;
        seal_tick := r.sg_seal_tick;
        started := r.sg_resize_started;
        blocked_keys := (select count(*) from pgque.key_block kb join pgque.slot_lease l on l.sl_sub = kb.kb_sub
                          where l.sl_queue = r.queue_id and l.sl_consumer = r.sg_consumer and kb.kb_state <> 'inflight');
        if r.sg_resize_to is null then
            phase := 'done';
            finished := r.sg_resized_at;
            slots_done := r.sg_nslots;
            slots_total := r.sg_nslots;
            held_keys := 0;
        else
            d := pgque._resize_drained(r.queue_id, r.sg_consumer, coalesce(r.sg_seal_tick, 9223372036854775807));
            finished := null;
            slots_done := d.o_done;
            slots_total := d.o_total;
            held_keys := d.o_held;
            phase := case when d.o_done < d.o_total then 'draining' when d.o_held > 0 then 'settling' else 'cutover' end;
        end if;
        return next;
    end loop;
end;
$$;


-- ==== partition/grants.sql ====
-- Partition layer privileges. Readers reach get_batch_cursor only through
-- these SECURITY DEFINER functions, which own it together with the engine.
revoke all on all functions in schema pgque from public;
select pgque._revoke_public_relations();

grant execute on function
    pgque.subscribe_slot(text, text, integer, integer),
    pgque.subscribe_slot(text, text, integer, integer, text),
    pgque.blocked_keys(text, text),
    pgque.unsubscribe_slot(text, text, integer, integer),
    pgque.claim_slot(text, text, integer, text, interval, uuid),
    pgque.release_slot(text, text, integer, text, uuid),
    pgque.receive_partitioned(text, text, integer, integer, text, uuid, integer),
    pgque.receive_partitioned_raw(text, text, integer, integer, text, uuid, integer, bigint, bigint, bigint),
    pgque.ack_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, bigint),
    pgque.nack_partitioned(text, text, integer, integer, text, uuid, bigint, interval, text),
    pgque.nack_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, bigint, interval, text),
    pgque.slot_of(text, integer),
    pgque.announce_worker(text, text, text, boolean, integer[], interval),
    pgque.hold_key_partitioned(text, text, integer, integer, text, uuid, bigint, bigint, text, bigint),
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


-- ==== version ====
select pgque._record_version('0.1.0');
