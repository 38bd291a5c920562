-- _check_interval(what, value, min, max): validates a duration argument
-- and returns it as the exact duration it stands for now (days and time,
-- no months).
--
-- Intervals compare with a month counted as 30 days and a year as 360, so
-- '10000 years -3599999 days' compares equal to '1 day' while adding it to
-- now() lands 144 years ahead. The bounds are therefore checked on what the
-- value does: (now + value) - now, a plain duration, in seconds, against
-- min and max in seconds (a day of the bounds is 24 hours: in a session
-- time zone whose clocks go forward within the next 30 days, now + '30
-- days' is 719 hours away, and a bound taken that way refused the 720-hour
-- delay the clients clamp to). Values that overflow a timestamp are refused
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
    if extract(epoch from v_dur) < extract(epoch from i_min) or extract(epoch from v_dur) > extract(epoch from i_max) then
        raise exception using errcode = 'PQ011',
            message = format('%s must be between %s and %s, not %s (%s from now)', i_what, i_min, i_max, i_value, v_dur);
    end if;
    return v_dur;
end;
$$;
