package partitiontest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// BenchmarkKeyViews measures the key views on a large backlog: a queue with
// PGQUE_KEYS_BENCH_EVENTS pending events (default 1,000,000) over
// PGQUE_KEYS_BENCH_KEYS keys (default 100,000), one consumer with 16 slots
// that has consumed nothing, and a tenth of the events on one hot key. Each
// sub-benchmark is one call as the console or 'pgque keys' makes it, with
// partition_slot_status (which counts every pending event) as the yardstick
// in the same run. Run it with:
//
//	go test -run '^$' -bench BenchmarkKeyViews -benchtime 10x ./internal/sqltest/partitiontest/
func BenchmarkKeyViews(b *testing.B) {
	events, keys := envInt(b, "PGQUE_KEYS_BENCH_EVENTS", 1000000), envInt(b, "PGQUE_KEYS_BENCH_KEYS", 100000)
	ctx := context.Background()
	pool := pgtest.Pool(b, pgtest.NewInstalledDB(b))
	exec := func(sql string, args ...any) {
		b.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%s: %v", sql, err)
		}
	}
	exec("select pgque.create_queue('kb')")
	exec("select pgque.subscribe_slot('kb', 'c', s, 16) from generate_series(0, 15) s")
	start := time.Now()
	const chunk = 20000
	for off := 0; off < events; off += chunk {
		// One event in ten is the hot key's; the rest spread over the keys.
		exec(`select pgque.send_batch('kb', 't', array_agg('{"n":1}'::jsonb),
				array_agg(case when i % 10 = 0 then 'hot' else 'tenant-' || (i::bigint * 7919 % $2) end))
			from generate_series($1::int, $1::int + $3 - 1) i`, off, keys, min(chunk, events-off))
	}
	exec("select pgque.force_next_tick('kb'); select pgque.ticker('kb')")
	exec("analyze pgque.event")
	b.Logf("backlog: %d events over %d keys (+1 hot) sent in %v", events, keys, time.Since(start).Round(time.Millisecond))

	for _, c := range []struct{ name, sql string }{
		{"partition_slot_status", "select count(*) from pgque.partition_slot_status where queue = 'kb'"},
		{"slot_heads", "select count(*) from pgque.slot_heads('kb', 'c')"},
		{"partition_slot_stalls", "select count(*) from pgque.partition_slot_stalls where queue = 'kb'"},
		{"key_heads_all_slots", "select count(*) from pgque.key_heads('kb', 'c')"},
		{"key_heads_all_slots_scan20k", "select count(*) from pgque.key_heads('kb', 'c', null, 20, 20000)"},
		{"key_heads_one_slot", "select count(*) from pgque.key_heads('kb', 'c', 3)"},
		{"key_shares_scan20k", "select count(*) from pgque.key_shares('kb', 'c', 20000)"},
		{"hot_keys", "select count(*) from pgque.hot_keys('kb', '1 hour')"},
		{"hot_keys_sample20k", "select count(*) from pgque.hot_keys('kb', '1 hour', 10, 20000)"},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				var n int64
				if err := pool.QueryRow(ctx, c.sql).Scan(&n); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func envInt(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatal(fmt.Sprintf("%s=%q: want a positive integer", name, v))
	}
	return n
}
