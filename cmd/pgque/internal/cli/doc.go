// Package cli implements the pgque command line: cobra commands, one file
// per command group, testable in-process through Run (args, stdin, stdout,
// stderr in; exit code out). cmd/pgque/main.go only calls Main.
//
// The command tree:
//
//	pgque install | upgrade | uninstall --yes [--drop-roles] | sql | version
//	pgque ticker                                  the leader-elected ticker daemon
//	pgque queue create|drop|list|config           queue admin
//	pgque subscribe | unsubscribe <queue> --consumer c
//	pgque slots subscribe|unsubscribe|status      partitioned consumers' slots
//	pgque slots policy|blocked|unblock|retry-now  the pause failure policy
//	pgque send <queue> [payload]                  argument, or JSON lines on stdin
//	pgque tail <queue>                            a console consumer
//	pgque status [queue] [--watch]                queues, consumers, slots, warnings
//	pgque dlq list|replay|purge <queue>           dead letters
//	pgque demo                                    the multi-tenant workload, verified
//	pgque bench                                   the benchmark suites
//	pgque relay --to URL                          each key's events POSTed in order (internal/relay)
//
// Conventions every command follows:
//
//   - The database comes from --dsn, else $PGQUE_DSN, else $DATABASE_URL.
//   - --json gives machine-readable output wherever a script would parse
//     the result; streams (tail, status --watch) print one JSON document per
//     line.
//   - A runtime error is one line on stderr, "pgque: <error>", and exit code
//     1. A mistake in the command line (unknown command or flag, wrong
//     arguments, a flag value that does not parse, a missing --yes) is one
//     line ending with a pointer to --help, and exit code 2. Neither ever
//     prints a stack trace or dumps the usage text; even a panic in a
//     command is one line, exit 1 (the stack only with PGQUE_DEBUG=1).
//   - Destructive commands (uninstall, queue drop, dlq purge) ask for --yes.
//   - Long-running commands (ticker, tail, status --watch, demo) stop
//     cleanly on SIGINT or SIGTERM and exit 0; a second signal kills.
//
// Every command works through the library's public API (package pgque and
// pgquemigrate), the same calls a service makes; views.go shapes its results
// into the JSON the commands print; tail reads chunk by chunk through
// pgque.Receiver, inside a transaction it may roll back.
package cli
