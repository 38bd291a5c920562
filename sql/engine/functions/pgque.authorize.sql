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
     where s.sub_id = pgque._batch_sub(i_batch_id);
    if found and i_action = any (v_confined) then
        perform pgque._authorize_id(v_id, i_action);
    end if;
end;
$$;

-- Reading a queue: its events, keys, dead letters, consumers, slots and
-- leases. Whoever may consume a queue may read it, through the very check
-- receive applies (_authorize_id with 'consume'); members of pgque_admin
-- (and superusers) read every queue, as they read its tables. A queue not
-- confined for 'consume' is readable by every pgque role, as before.

-- _may_read(queue_id): true when the login may read the queue, false
-- otherwise (also for an unknown id). SECURITY DEFINER and granted to the
-- three pgque roles because the views partition_slot_status, _leases and
-- _stalls call it with the caller's rights to leave out the rows of
-- queues the caller may not read. Reveals nothing but that answer.
-- Tables: queue, queue_grant (read).
create or replace function pgque._may_read(i_queue_id integer)
returns boolean language sql stable security definer
set search_path = pg_catalog, pg_temp
as $$
    select coalesce((
        select not ('consume' = any (q.queue_confined))
            or pg_has_role(session_user, 'pgque_admin', 'MEMBER')
            or exists (select 1 from pgque.queue_grant g
                        where g.qg_queue = q.queue_id and g.qg_action = 'consume'
                          and pg_has_role(session_user, g.qg_role, 'MEMBER'))
          from pgque.queue q where q.queue_id = i_queue_id), false)
$$;

-- _authorize_read(queue): the check every function that returns a queue's
-- data, keys or dead letters calls first: raises 42501 (the message
-- receive gives) unless _may_read. Does nothing for an unknown queue (the
-- caller raises PQ001 itself). Returns true, so that it can run as a
-- declaration.
create or replace function pgque._authorize_read(i_queue text)
returns boolean language plpgsql stable
set search_path = pg_catalog, pg_temp
as $$
declare
    v_id integer;
begin
    select queue_id into v_id from pgque.queue where queue_name = i_queue;
    if found and not pgque._may_read(v_id) then
        perform pgque._authorize_id(v_id, 'consume');
    end if;
    return true;
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
