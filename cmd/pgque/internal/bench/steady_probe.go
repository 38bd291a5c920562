package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// What the steady suite reads from the server around a measured window:
// pg_stat_statements (server time, calls, buffers per statement), the WAL
// position, and the CPU time of the server's processes from /proc.

// pgssLibrary is the library the steady suite needs preloaded for its
// server-time figures.
const pgssLibrary = "pg_stat_statements"

// preloadSettings returns the shared_preload_libraries setting a throwaway
// cluster in binDir needs for libs, keeping only the libraries the build
// ships (a build without contrib still starts; the suite then says what it
// could not measure).
func preloadSettings(binDir string, libs []string) map[string]string {
	var have []string
	for _, lib := range libs {
		if _, err := os.Stat(filepath.Join(filepath.Dir(binDir), "lib", lib+".so")); err == nil {
			have = append(have, lib)
		}
	}
	if len(have) == 0 {
		return nil
	}
	return map[string]string{"shared_preload_libraries": strings.Join(have, ",")}
}

// withAppName sets application_name in a URL or keyword/value DSN, so that
// the backends of one role in a run (producer, ticker, consumer) can be told
// apart in pg_stat_activity.
func withAppName(dsn, name string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			q := u.Query()
			q.Set("application_name", name)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return strings.TrimSpace(dsn) + " application_name='" + name + "'"
}

// pgssStat is the sum of pg_stat_statements counters over a set of
// statements.
type pgssStat struct {
	calls    float64
	execMS   float64
	buffers  float64 // shared blocks hit + read
	walBytes float64
}

func (s *pgssStat) add(o pgssStat) {
	s.calls += o.calls
	s.execMS += o.execMS
	s.buffers += o.buffers
	s.walBytes += o.walBytes
}

// statementFamily names the part of the work a top-level statement belongs
// to: "consume" (receive and ack functions, which include the folded ack),
// "send", "tick" (ticker and maintenance), or "" for the rest (the bench's
// own probes, lease renewals, presence).
func statementFamily(query string) string {
	q := strings.ToLower(query)
	switch {
	case strings.Contains(q, "pg_stat_statements"), strings.Contains(q, "pg_stat_activity"):
		return ""
	case strings.Contains(q, "pgque.receive"), strings.Contains(q, "pgque.ack"):
		return "consume"
	case strings.Contains(q, "pgque.send"), strings.Contains(q, "pgque.insert_event"):
		return "send"
	case strings.Contains(q, "pgque.ticker"), strings.Contains(q, "pgque.maint"), strings.Contains(q, "pgque._tick"):
		return "tick"
	}
	return ""
}

// pgssProbe reads pg_stat_statements for one database; nil when the
// server does not have the library loaded.
type pgssProbe struct {
	conn *pgx.Conn
}

// newPgssProbe creates the extension in the database conn is connected to
// when the server preloads the library, and returns nil (and the reason)
// when it does not.
func newPgssProbe(ctx context.Context, conn *pgx.Conn) (*pgssProbe, string, error) {
	var libs string
	if err := conn.QueryRow(ctx, "select current_setting('shared_preload_libraries')").Scan(&libs); err != nil {
		return nil, "", err
	}
	if !strings.Contains(libs, pgssLibrary) {
		return nil, "pg_stat_statements is not in shared_preload_libraries (the bench's own cluster loads it when the build ships it)", nil
	}
	if _, err := conn.Exec(ctx, "create extension if not exists pg_stat_statements"); err != nil {
		return nil, "", fmt.Errorf("creating extension pg_stat_statements: %w", err)
	}
	return &pgssProbe{conn: conn}, "", nil
}

func (p *pgssProbe) reset(ctx context.Context) error {
	if p == nil {
		return nil
	}
	_, err := p.conn.Exec(ctx, "select pg_stat_statements_reset()")
	return err
}

// read returns the counters since the last reset per statement family, of
// the statements run in the probe's database.
func (p *pgssProbe) read(ctx context.Context) (map[string]pgssStat, error) {
	if p == nil {
		return nil, nil
	}
	rows, err := p.conn.Query(ctx, `select query, calls::float8, total_exec_time, (shared_blks_hit + shared_blks_read)::float8, wal_bytes::float8
	  from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())`)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_statements: %w", err)
	}
	defer rows.Close()
	out := map[string]pgssStat{}
	for rows.Next() {
		var q string
		var s pgssStat
		if err := rows.Scan(&q, &s.calls, &s.execMS, &s.buffers, &s.walBytes); err != nil {
			return nil, err
		}
		if f := statementFamily(q); f != "" {
			t := out[f]
			t.add(s)
			out[f] = t
		}
	}
	return out, rows.Err()
}

// procProbe reads the CPU time of the server's processes from /proc; it is
// only usable when the server runs on this machine (its backends' working
// directory is the server's data directory).
type procProbe struct {
	conn *pgx.Conn
}

// newProcProbe returns nil and the reason when the server's processes are
// not visible here.
func newProcProbe(ctx context.Context, conn *pgx.Conn) (*procProbe, string) {
	var pid int
	var dataDir string
	if err := conn.QueryRow(ctx, "select pg_backend_pid(), current_setting('data_directory')").Scan(&pid, &dataDir); err != nil {
		return nil, "cannot read the server's data directory (needs a superuser or pg_read_all_settings): " + err.Error()
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil || filepath.Clean(cwd) != filepath.Clean(dataDir) {
		return nil, "the server's processes are not visible in this machine's /proc"
	}
	return &procProbe{conn: conn}, ""
}

// cpuTicksPerSecond is USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat; Linux fixes it at 100 on every architecture Go runs on.
const cpuTicksPerSecond = 100

// procCPU returns utime+stime of pid in clock ticks.
func procCPU(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: the fields after it
	// start after its closing parenthesis, with field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return utime + stime, nil
}

// cpuSnapshot is the CPU ticks of every server process, by pid, with the
// group each belongs to ("consumer", "producer", "ticker" by application
// name, "other" for the rest: other sessions and background processes).
type cpuSnapshot map[int]cpuProc

type cpuProc struct {
	group string
	ticks int64
}

// snapshot reads every server process pg_stat_activity lists, background
// processes included (the postmaster, which only forks, is not listed).
func (p *procProbe) snapshot(ctx context.Context, groups map[string]string) (cpuSnapshot, error) {
	if p == nil {
		return nil, nil
	}
	rows, err := p.conn.Query(ctx, `select pid, coalesce(application_name, '') from pg_stat_activity`)
	if err != nil {
		return nil, fmt.Errorf("listing server processes: %w", err)
	}
	defer rows.Close()
	out := cpuSnapshot{}
	for rows.Next() {
		var pid int
		var app string
		if err := rows.Scan(&pid, &app); err != nil {
			return nil, err
		}
		t, err := procCPU(pid)
		if err != nil {
			continue // the process ended since the query
		}
		g := groups[app]
		if g == "" {
			g = "other"
		}
		out[pid] = cpuProc{group: g, ticks: t}
	}
	return out, rows.Err()
}

// cpuDelta returns the CPU seconds each group spent between two snapshots,
// plus "all". A process that appeared in between counts from zero (it
// started within the window); one that ended is lost, which the suite
// avoids by keeping its connections open.
func cpuDelta(before, after cpuSnapshot) map[string]float64 {
	out := map[string]float64{}
	for pid, a := range after {
		d := a.ticks - before[pid].ticks
		if d < 0 {
			d = a.ticks // the pid was reused
		}
		sec := float64(d) / cpuTicksPerSecond
		out[a.group] += sec
		out["all"] += sec
	}
	return out
}

// walLSN returns the server's current WAL insert position in bytes.
func walLSN(ctx context.Context, c *pgx.Conn) (int64, error) {
	var n int64
	err := c.QueryRow(ctx, "select pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&n)
	return n, err
}

// namedPool opens a pool of at most maxConns connections to dsn whose
// backends carry application name app, closed by env.close.
func namedPool(ctx context.Context, e *env, dsn, app string, maxConns int) (*pgxpool.Pool, error) {
	return e.pool(ctx, withAppName(dsn, app), maxConns)
}
