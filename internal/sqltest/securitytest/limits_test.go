package securitytest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

var sprintf = fmt.Sprintf

// trickyIntervals compare as short (a month is 30 days, a year 360 in
// interval comparison) but are long, or overflow, when added to now().
var trickyIntervals = []string{
	`'10000 years -3599999 days'`, // compares as 1 day, lands 144 years ahead
	`'100 years -35999 days'`,     // compares as 1 day, about 1.4 years
	`'12 months -359 days'`,       // compares as 1 day, about 6 days
	`'1 month'`,                   // 28 to 31 days
	`'1 year'`,                    // 365 or 366 days
	`'178000000 years'`,           // overflows a timestamp
	`'-178000000 years'`,
	`'1 day 1 second'`,
	`'24 hours 1 microsecond'`,
	`'-1 microsecond'`,
	`'-10000 years 3600001 days'`, // compares as +1 day, is -144 years
}

// TestIntervalBoundsOnRealDurations calls every entry point that takes a
// duration from a caller with intervals that pass a naive interval
// comparison, as the role that may call it: each is refused with PQ011 (or
// 22004 for NULL) and nothing is written; a sane value still passes.
func TestIntervalBoundsOnRealDurations(t *testing.T) {
	_, conn := setupDB(t)
	ctx := context.Background()
	type call struct {
		role, sql, ok string // sql has one %s for the interval; ok is a valid interval
		max           string // a value the call must accept at its upper bound
	}
	calls := []call{
		{roleAdmin, `select pgque.ticker_lead('w-int', %s)`, `'10 s'`, `'1 day'`},
		{roleAdmin, `select pgque.set_queue_config('q1', 'ticker_idle_period', (%s)::interval::text)`, `'1 min'`, `'1 day'`},
		{roleAdmin, `select pgque.set_queue_config('q1', 'ticker_max_lag', (%s)::interval::text)`, `'10 ms'`, `'1 day'`},
		{roleAdmin, `select pgque.set_queue_config('q1', 'rotation_period', (%s)::interval::text)`, `'2 hours'`, `'365 days'`},
	}
	for _, c := range calls {
		for _, iv := range trickyIntervals {
			if c.max == `'365 days'` && (iv == `'1 month'` || iv == `'12 months -359 days'` || iv == `'1 day 1 second'` || iv == `'24 hours 1 microsecond'` || iv == `'100 years -35999 days'`) {
				continue // within a year: valid for rotation_period
			}
			if c.max == `'365 days'` && iv == `'1 year'` {
				continue // 365 or 366 days: depends on the date, not tested
			}
			code, msg := sqlstate(t, conn, c.role, sprintf(c.sql, iv))
			if code != "PQ011" {
				t.Errorf("as %s: %s = %s %s, want PQ011", c.role, sprintf(c.sql, iv), code, msg)
			}
		}
		for _, iv := range []string{c.ok, c.max} {
			if code, msg := sqlstate(t, conn, c.role, sprintf(c.sql, iv)); code != "" {
				t.Errorf("as %s: %s = %s %s, want success", c.role, sprintf(c.sql, iv), code, msg)
			}
		}
	}

	// nack: a reader's retry delay on an open batch, 0 to 30 days.
	for _, s := range []string{`select pgque.send('q1', 't', '{"n":1}'::jsonb, 'k9')`, `select pgque.force_next_tick('q1')`, `select pgque.ticker('q1')`} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(s, err)
		}
	}
	if _, err := conn.Exec(ctx, `set role `+roleReader); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `reset role`)
	var batch, msg int64
	if err := conn.QueryRow(ctx, `select batch_id, msg_id from pgque.receive('q1', 'c1', 10) limit 1`).Scan(&batch, &msg); err != nil {
		t.Fatal("receive:", err)
	}
	if _, err := conn.Exec(ctx, `reset role`); err != nil {
		t.Fatal(err)
	}
	for _, iv := range append(trickyIntervals, `'31 days'`, `'30 days 1 second'`) {
		if iv == `'1 day 1 second'` || iv == `'24 hours 1 microsecond'` || iv == `'12 months -359 days'` {
			continue // within 30 days
		}
		stmt := sprintf(`select pgque.nack(%d, %d, %s, 'r')`, batch, msg, iv)
		if code, m := sqlstate(t, conn, roleReader, stmt); code != "PQ011" {
			t.Errorf("as reader: %s = %s %s, want PQ011", stmt, code, m)
		}
	}
	// The bound is 720 hours, the clients' clamp, in any session time
	// zone: in one whose clocks go forward in two days, now() + '30 days'
	// is 719 hours away, and a bound taken that way refused the clamp.
	if _, err := conn.Exec(ctx, `set time zone '`+springForwardZone(time.Now())+`'`); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `reset time zone`)
	var ahead string
	if err := conn.QueryRow(ctx, `select ((now() + interval '30 days') - now())::text`).Scan(&ahead); err != nil {
		t.Fatal(err)
	}
	if ahead != "29 days 23:00:00" {
		t.Fatalf("the spring-forward zone: now() + 30 days is %s from now, want 29 days 23:00:00", ahead)
	}
	for _, c := range []struct{ iv, code string }{{`'720 hours'`, ""}, {`'30 days'`, ""}, {`'720 hours 1 second'`, "PQ011"}} {
		stmt := sprintf(`select pgque.nack(%d, %d, %s, 'r')`, batch, msg, c.iv)
		if code, m := sqlstate(t, conn, roleReader, stmt); code != c.code {
			t.Errorf("as reader, clocks going forward within 30 days: %s = %q %s, want %q", stmt, code, m, c.code)
		}
	}
	stmt := sprintf(`select pgque.nack(%d, %d, '30 days', repeat('é', 5000))`, batch, msg)
	if code, m := sqlstate(t, conn, roleReader, stmt); code != "" {
		t.Fatalf("as reader: nack at the 30-day bound: %s %s", code, m)
	}
}

// springForwardZone is a POSIX time zone, 3 hours west of UTC, whose clocks
// go forward an hour two days after now and back a hundred days later:
// a "30 days" from now is then 719 hours long, whatever today's date.
func springForwardZone(now time.Time) string {
	// Jn counts 1 to 365 and never Feb 29.
	jday := func(t time.Time) int {
		d := t.YearDay()
		if y := t.Year(); (y%4 == 0 && y%100 != 0 || y%400 == 0) && d > 59 {
			d--
		}
		return d
	}
	start := now.UTC().AddDate(0, 0, 2)
	end := (jday(start)+100-1)%365 + 1
	return fmt.Sprintf("AAA3BBB,J%d/2,J%d/2", jday(start), end)
}
