package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque/internal/pgcluster"
)

// env is what a suite runs against: a server, a way to make fresh databases
// on it, the run's mode and its progress output.
type env struct {
	quick    bool
	tiny     bool // the tests' smallest mode (implies quick)
	out      io.Writer
	start    time.Time
	cluster  *pgcluster.Cluster // nil when running against Options.DSN
	adminDSN string             // a database on the server to run CREATE DATABASE from
	upstream *upstreamFile      // upstream PgQue's installer, with Options.UpstreamSQL
	dbPrefix string             // Options.dbPrefix
	only     *regexp.Regexp     // Options.Only
	// handlerTime is Options.HandlerTime.
	handlerTime time.Duration
	// tickLag is Options.TickLag.
	tickLag time.Duration

	mu     sync.Mutex
	pools  []*pgxpool.Pool
	extras []func(*Environment) // facts suites learned about the environment
}

// setExtra records a fact a suite learned about the environment (the Node
// version pg-boss ran on, say) for the report.
func (e *env) setExtra(f func(*Environment)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.extras = append(e.extras, f)
}

// clusterSettings are the parameters the throwaway cluster runs with, on top
// of pgcluster's defaults (fsync off, 300 connections, 256MB shared
// buffers). Autovacuum stays on, as in production: the bloat suite reports
// churn counters that do not depend on when it runs.
var clusterSettings = map[string]string{
	"max_wal_size":     "4GB",
	"log_min_messages": "warning",
}

// newEnv connects to dsn, or starts a throwaway cluster when dsn is empty;
// that cluster preloads those of libs its build ships (only the suites that
// need a library get it, so the others' figures carry no cost of it).
func newEnv(ctx context.Context, dsn string, quick, tiny bool, libs []string, out io.Writer) (*env, error) {
	e := &env{quick: quick || tiny, tiny: tiny, out: out, start: time.Now()}
	if dsn == "" {
		e.logf("starting a throwaway PostgreSQL cluster")
		settings := maps.Clone(clusterSettings)
		if binDir, err := pgcluster.FindBinDir(); err == nil {
			maps.Copy(settings, preloadSettings(binDir, libs))
		}
		c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: settings})
		if err != nil {
			return nil, fmt.Errorf("starting a throwaway cluster: %w", err)
		}
		e.cluster = c
		e.adminDSN = c.DSN("postgres")
	} else {
		e.adminDSN = dsn
	}
	conn, err := pgx.Connect(ctx, e.adminDSN)
	if err != nil {
		e.close(ctx)
		return nil, fmt.Errorf("connecting to the benchmark server: %w", err)
	}
	conn.Close(ctx)
	return e, nil
}

// close closes every pool the suites left open and stops the throwaway
// cluster.
func (e *env) close(ctx context.Context) {
	e.mu.Lock()
	pools := e.pools
	e.pools = nil
	e.mu.Unlock()
	for _, p := range pools {
		p.Close()
	}
	if e.cluster != nil {
		if err := e.cluster.Stop(ctx); err != nil {
			e.logf("stopping the throwaway cluster: %v", err)
		}
	}
}

// logf writes one progress line, prefixed with the time since the run began.
func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.out, "[%6.1fs] %s\n", time.Since(e.start).Seconds(), fmt.Sprintf(format, args...))
}

// pick returns quick in quick mode, full otherwise. In the tests' tiny
// mode it shrinks the quick value: counts to a quarter (at least 1),
// durations to a third (at least 100 ms).
func pick[T int | time.Duration](e *env, quick, full T) T {
	switch {
	case e.tiny:
		switch v := any(quick).(type) {
		case int:
			return T(max(1, v/4))
		case time.Duration:
			return T(max(100*time.Millisecond, v/3))
		}
		return quick
	case e.quick:
		return quick
	}
	return full
}

// dsnFor returns a DSN for database db on the benchmark server.
func (e *env) dsnFor(db string) string {
	if e.cluster != nil {
		return e.cluster.DSN(db)
	}
	return withDatabase(e.adminDSN, db)
}

// withDatabase rewrites the database of a URL or keyword/value DSN.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err == nil {
			u.Path = "/" + db
			return u.String()
		}
	}
	// In keyword/value form the last occurrence of a keyword wins.
	return strings.TrimSpace(dsn) + " dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'"
}

// freshDB drops database name (after the run's prefix, Options.dbPrefix)
// if it exists, creates it and returns its DSN.
func (e *env) freshDB(ctx context.Context, name string) (string, error) {
	name = e.dbPrefix + name
	conn, err := pgx.Connect(ctx, e.adminDSN)
	if err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	id := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "drop database if exists "+id+" with (force)"); err != nil {
		return "", fmt.Errorf("dropping database %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "create database "+id); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return e.dsnFor(name), nil
}

// freshPool is freshDB with a pool of at most maxConns connections to the
// new database.
func (e *env) freshPool(ctx context.Context, name string, maxConns int) (string, *pgxpool.Pool, error) {
	dsn, err := e.freshDB(ctx, name)
	if err != nil {
		return "", nil, err
	}
	pool, err := e.pool(ctx, dsn, maxConns)
	return dsn, pool, err
}

// pool opens a pool of at most maxConns connections to dsn, closed by
// env.close if the suite does not close it first.
func (e *env) pool(ctx context.Context, dsn string, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing DSN: %w", err)
	}
	cfg.MaxConns = int32(maxConns)
	cfg.MinConns = 0
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening a pool: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("connecting: %w", err)
	}
	e.mu.Lock()
	e.pools = append(e.pools, p)
	e.mu.Unlock()
	return p, nil
}

// describe fills the report's Environment.
func (e *env) describe(ctx context.Context) Environment {
	env := hostEnvironment()
	env.Cluster = "external DSN"
	if e.cluster != nil {
		// The bin directory says which build ran: Debian's, or one that
		// PGQUE_PG_VERSION / PGQUE_PG_BINDIR chose.
		env.Cluster = "throwaway (internal/pgcluster, " + e.cluster.BinDir() + ")"
	}
	conn, err := pgx.Connect(ctx, e.adminDSN)
	if err != nil {
		env.Server = "unknown: " + err.Error()
		return env
	}
	defer conn.Close(ctx)
	_ = conn.QueryRow(ctx, "select version()").Scan(&env.Server)
	var fsync, sc, sb, mc string
	err = conn.QueryRow(ctx, `select current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('shared_buffers'), current_setting('max_connections')`).Scan(&fsync, &sc, &sb, &mc)
	if err == nil {
		env.Settings = fmt.Sprintf("fsync=%s synchronous_commit=%s shared_buffers=%s max_connections=%s", fsync, sc, sb, mc)
	}
	_ = conn.QueryRow(ctx, `select coalesce((select default_version from pg_available_extensions where name = 'pgq'), '')`).Scan(&env.PgQVersion)
	return env
}

// exec runs statements on dsn in one connection, in order.
func execAll(ctx context.Context, dsn string, stmts ...string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", firstLine(s), err)
		}
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " ..."
	}
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

// errSkipped marks a case that could not run for a reason outside pgque
// (a missing extension, npm unreachable); the suite reports it as a failure
// with this text rather than inventing a figure.
var errSkipped = errors.New("not run")
