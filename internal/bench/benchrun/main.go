// Command benchrun runs pgque's benchmark suites without the pgque CLI:
//
//	go run ./internal/bench/benchrun [-quick] [-dsn DSN] [-suites floor,pgq] [-out docs/benchmarks]
//
// It is the same entry point as `pgque bench` (bench.Run), kept so the
// suites can be run while developing them.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/pgque/pgque/internal/bench"
)

func main() {
	var opts bench.Options
	var suites string
	flag.BoolVar(&opts.Quick, "quick", false, "shrink every suite so the whole run takes under two minutes")
	flag.StringVar(&opts.DSN, "dsn", "", "server to benchmark (empty: a throwaway cluster)")
	flag.StringVar(&suites, "suites", "", "comma-separated suites to run (default all: "+strings.Join(bench.SuiteNames(), ",")+")")
	flag.StringVar(&opts.OutDir, "out", bench.OutDirDefault, `directory for report.json and the SVG charts ("-" for none)`)
	flag.Parse()
	if suites != "" {
		opts.Suites = strings.Split(suites, ",")
	}
	opts.Progress = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := bench.Run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "pgque bench:", err)
		os.Exit(1)
	}
}
