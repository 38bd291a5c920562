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
