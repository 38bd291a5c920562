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
-- That holds for a superuser too: a schema another role owns may be that
-- role's trap (a superuser who went on as its owner would install a pgque
-- that role owns, SECURITY DEFINER functions and every payload with it).
-- A superuser upgrading a pgque that another role installed says which
-- role it trusts by installing as that role: with options '-c role=<owner>'
-- on its connection (or SET ROLE, then install in that session).
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
        raise exception using
            errcode = '42501',
            message = pg_catalog.format('schema pgque is owned by role %s, not by the installing role %s: refusing to install into it',
                                        v_owner::regrole::text, current_user),
            hint = pg_catalog.format('install as role %s (a superuser can add options=''-c role=%s'' to its connection string), '
                                     'or drop the schema if that role did not install pgque',
                                     v_owner::regrole::text, v_owner::regrole::text);
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
