// Package pgcluster starts throwaway PostgreSQL clusters from the server
// binaries installed on the machine.
//
// Which build runs: PGQUE_PG_BINDIR names a bin directory; else
// PGQUE_PG_VERSION names a major, looked up in the build cache that
// scripts/fetch-postgres fills (PGQUE_PG_CACHE, default .cache/postgres in
// the repository) and then in Debian's /usr/lib/postgresql/<major>/bin; else
// pg_config's bin directory or the newest Debian one (15 in CI). A variable
// that names no build is an error, never a fallback to another version.
//
// A cluster lives in a fresh temporary directory: initdb creates the data
// directory inside it and the server listens only on a Unix socket in that
// same directory (no TCP), so any number of clusters can run side by side
// without port conflicts. Durability is traded for speed (fsync=off); the
// cluster is meant for tests, the demo command and benchmarks, never for data
// anyone wants to keep.
//
// PostgreSQL refuses to run as root. When the calling process is root, the
// server commands run as an unprivileged OS user (pgque, created on demand,
// else nobody) that owns the cluster directory; the directory stays readable
// by everyone so the root process can still reach the socket.
//
// The life cycle is Start, then any number of Restart or Kill calls (used by
// crash-recovery tests), then Stop, which removes every file.
//
// Processes: pg_ctl daemonizes the postmaster, so the server is not a child
// of the caller. Beside it runs one watchdog (a /bin/sh loop in its own
// session) that shuts the server down and removes the directory if the
// caller exits without Stop, as a test binary that times out does; Stop
// ends the watchdog.
package pgcluster
