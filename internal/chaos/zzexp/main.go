package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
)

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	ctx := context.Background()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	must(err)
	defer c.Stop(ctx)
	dsn, err := c.CreateDatabase(ctx, "x")
	must(err)
	conn, err := pgx.Connect(ctx, dsn)
	must(err)
	_, err = install.Install(ctx, conn)
	must(err)
	policy := os.Args[1]
	n := os.Args[2]
	for _, s := range []string{
		`select pgque.create_queue('q')`,
		`select pgque.subscribe_slot('q', 'c', s, 8) from generate_series(0, 7) s`,
		`select pgque.set_failure_policy('q', 'c', '` + policy + `')`,
		`select pgque.claim_slot('q', 'c', 0, 'w', '1 hour')`,
	} {
		_, err := conn.Exec(ctx, s)
		must(err)
	}
	// backlog: n events over 64 keys, ticked every 50 events
	t0 := time.Now()
	_, err = conn.Exec(ctx, `do $$ begin for i in 1..`+n+` loop
		perform pgque.send('q', 't', '{}', 'tenant-' || (i % 64));
		if i % 50 = 0 then perform pgque.force_next_tick('q'); perform pgque.ticker('q'); end if;
	  end loop; end $$`)
	must(err)
	fmt.Println("backlog", n, time.Since(t0))
	// commit-separated ticks: the do block above runs in one transaction, so tick afterwards
	for i := 0; i < 5; i++ {
		conn.Exec(ctx, `select pgque.force_next_tick('q')`)
		conn.Exec(ctx, `select pgque.ticker('q')`)
	}
	recv := func(label string) []int64 {
		t := time.Now()
		rows, err := conn.Query(ctx, `select msg_id from pgque.receive_partitioned('q', 'c', 0, 8, 'w', 10)`)
		must(err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		must(err)
		fmt.Printf("%s: %d rows in %v\n", label, len(ids), time.Since(t))
		return ids
	}
	for i := 0; i < 3; i++ {
		t := time.Now()
		_, err := conn.Exec(ctx, `select * from pgque.partition_slot_status`)
		must(err)
		fmt.Println("partition_slot_status", time.Since(t))
	}
	for _, q := range []string{"load 'auto_explain'", "set auto_explain.log_min_duration = 50", "set auto_explain.log_nested_statements = on", "set auto_explain.log_analyze = on"} {
		_, err := conn.Exec(ctx, q)
		must(err)
	}
	defer func() { fmt.Println(c.LogTail(120)) }()
	var ids []int64
	for i := 0; len(ids) == 0 && i < 6; i++ {
		ids = recv(fmt.Sprintf("receive #%d", i))
		if len(ids) == 0 {
			conn.Exec(ctx, `select pgque.ack_partitioned('q', 'c', 0, 8, 'w')`)
		}
	}
	t := time.Now()
	_, err = conn.Exec(ctx, `select pgque.nack_partitioned('q', 'c', 0, 8, 'w', $1, '1 hour', 'x')`, ids[0])
	must(err)
	_, err = conn.Exec(ctx, `select pgque.ack_partitioned('q', 'c', 0, 8, 'w')`)
	must(err)
	fmt.Println("nack+ack", time.Since(t))
	for i := 0; i < 5; i++ {
		recv(fmt.Sprintf("receive %d after a blocked key", i))
		t := time.Now()
		_, err = conn.Exec(ctx, `select pgque.ack_partitioned('q', 'c', 0, 8, 'w')`)
		must(err)
		fmt.Println("  ack", time.Since(t))
	}
}
