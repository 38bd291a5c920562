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
