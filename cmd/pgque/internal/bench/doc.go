// Package bench holds pgque's benchmark suites: the drivers behind
// `pgque bench` and the figures in docs/benchmarks.md.
//
// Every figure is a ratio against a reference measured in the same run, on
// the same cluster, interleaved with it: the machines we run on are small and
// shared, so an absolute events-per-second number from one run says little,
// while "send at 16 connections is 0.93x a raw INSERT into an equivalent
// table, measured in alternating rounds a second apart" survives the noise.
//
// The references are:
//
//   - the physical floor: raw INSERT / INSERT ... SELECT / SELECT against a
//     table shaped exactly like a pgque event table (suite floor);
//   - the PgQ C extension (Debian package postgresql-15-pgq3) in its own
//     database on the same cluster (suite pgq);
//   - peers a user would pick instead: pg-boss with its key_strict_fifo
//     policy (a Node script under pgboss/, driven with exec) and River
//     (suite peers).
//
// Two suites measure costs per event rather than ratios: steady (server
// time, calls and buffers from pg_stat_statements, CPU of the server's
// processes from /proc, WAL and latency at a fixed send rate) and wal (every
// WAL record of a keyed send, from pg_walinspect). With
// Options.UpstreamSQL both also measure upstream PgQue, installed from a
// file the user supplies into a database of its own on the same cluster,
// beside pgque (upstream.go).
//
// A suite is one named function that measures its cases together with the
// references it compares them to, so each suite can run alone. Throughput
// cases run in interleaved rounds (A, B, A, B, ...) and report the median
// round; see measure.go. The Report is printed as a table, written as
// report.json, and drawn as one SVG bar chart per suite (see report.go and
// svg.go).
//
// Databases: each suite works in its own database(s), named bench_<suite>...,
// dropped and recreated at the start of the suite, on the cluster named by
// Options.DSN or on a throwaway cluster started with internal/pgcluster.
package bench
