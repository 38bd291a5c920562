package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The pg-boss side of the peers suite: a Node script (pgboss/driver.mjs)
// with pg-boss pinned by package-lock.json. The files are embedded, so the
// bench runs from any directory: they are written to a cache directory
// named after their hash, where `npm ci` installs pg-boss once.

//go:embed pgboss/driver.mjs pgboss/package.json pgboss/package-lock.json
var pgbossFiles embed.FS

// pgbossVersion is the pg-boss version package.json pins.
const pgbossVersion = "12.38.0"

// pgbossDriver is an installed copy of the driver.
type pgbossDriver struct {
	dir  string
	node string // `node --version`
}

// setupPgBoss finds node and npm, writes the driver into the cache and
// installs its dependencies when they are missing.
func setupPgBoss(ctx context.Context, e *env) (*pgbossDriver, error) {
	node, err := nodeVersion(ctx, "pg-boss needs Node.js and npm (node is not on PATH; install Node.js 20 or newer: pg-boss 12 declares 22.12 but runs on 20)")
	if err != nil {
		return nil, err
	}
	nodeSetup.Lock()
	defer nodeSetup.Unlock()
	dir, err := cacheEmbedded(pgbossFiles, "pgboss", "bench-pgboss-", "driver.mjs", "package.json", "package-lock.json")
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "pg-boss", "package.json")); err != nil {
		npm, lerr := exec.LookPath("npm")
		if lerr != nil {
			return nil, fmt.Errorf("%w: pg-boss is not installed in %s and npm is not on PATH to install it", errSkipped, dir)
		}
		e.logf("   installing pg-boss %s with npm ci in %s", pgbossVersion, dir)
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%w: npm ci of pg-boss %s failed: %v: %s", errSkipped, pgbossVersion, err, strings.TrimSpace(string(out)))
		}
	}
	return &pgbossDriver{dir: dir, node: node}, nil
}

// describe records the pg-boss and Node.js versions in the report's
// environment.
func (d *pgbossDriver) describe(e *env) {
	e.setExtra(func(env *Environment) {
		env.PgBoss = pgbossVersion
		env.NodeJS = d.node
	})
}

// nodeVersion returns `node --version`, or an error wrapping errSkipped
// with missing when node is not on PATH.
func nodeVersion(ctx context.Context, missing string) (string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return "", fmt.Errorf("%w: %s", errSkipped, missing)
	}
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("running node --version: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// cacheEmbedded writes the files of directory sub of fsys into a cache
// directory named prefix plus their hash, so the bench runs from any
// directory and a changed driver gets a directory of its own.
func cacheEmbedded(fsys embed.FS, sub, prefix string, names ...string) (string, error) {
	h := sha256.New()
	for _, name := range names {
		b, err := fsys.ReadFile(sub + "/" + name)
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "pgque", prefix+hex.EncodeToString(h.Sum(nil))[:12])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, name := range names {
		b, _ := fsys.ReadFile(sub + "/" + name)
		path := filepath.Join(dir, name)
		// A file already in place is left alone: a driver another run
		// is starting reads it meanwhile.
		if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, b) {
			continue
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// nodeSetup makes one suite at a time write a Node.js driver into the
// cache or install or build what it needs (setupPgBoss, setupTS): suites
// that run side by side would otherwise run npm in the same directory at
// once.
var nodeSetup sync.Mutex

// nodeConnection is the node-postgres connection config for dsn.
func nodeConnection(dsn string) (map[string]any, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	return map[string]any{"host": cc.Host, "port": cc.Port, "user": cc.User, "password": cc.Password, "database": cc.Database}, nil
}

// runNode runs `node driver.mjs <cfg as JSON>` in dir and decodes the last
// line it prints into res, which must have an Error field the driver sets
// on failure (see driverError).
func runNode(ctx context.Context, dir, what string, cfg map[string]any, res driverError) error {
	arg, _ := json.Marshal(cfg)
	cmd := exec.CommandContext(ctx, "node", "driver.mjs", string(arg))
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	line := strings.TrimSpace(stdout.String())
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if jerr := json.Unmarshal([]byte(line), res); jerr != nil {
		return fmt.Errorf("%s driver: %v; stdout: %q; stderr: %q", what, errors.Join(runErr, jerr), tail(stdout.String()), tail(stderr.String()))
	}
	if msg := res.driverError(); msg != "" || runErr != nil {
		return fmt.Errorf("%s driver failed: %s %v; stderr: %q", what, msg, runErr, tail(stderr.String()))
	}
	return nil
}

// driverError is a driver's result: the error it reported, if any.
type driverError interface{ driverError() string }

// pgbossResult is what driver.mjs prints.
type pgbossResult struct {
	Events          int     `json:"events"`
	Handled         int     `json:"handled"`
	TimedOut        bool    `json:"timed_out"`
	LoadMS          float64 `json:"load_ms"`
	WorkMS          float64 `json:"work_ms"`
	FirstMS         float64 `json:"first_ms"`
	OrderViolations int     `json:"order_violations"`
	RSSPeak         float64 `json:"rss_peak"`
	Error           string  `json:"error"`
}

func (r *pgbossResult) driverError() string { return r.Error }

// run executes the per-tenant ordered workload against database dsn with
// workers local workers, each fetching up to batchSize jobs at a time and
// running them one after another. The drain stops after budget; the
// result then says how many jobs were handled (TimedOut).
func (d *pgbossDriver) run(ctx context.Context, dsn string, events, tenants, workers, batchSize int, cost, budget time.Duration) (*pgbossResult, error) {
	conn, err := nodeConnection(dsn)
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{
		"connection": conn,
		"events":     events, "tenants": tenants, "workers": workers,
		"batchSize": batchSize, "handlerMs": cost.Milliseconds(),
		"timeoutMs": budget.Milliseconds(),
	}
	var res pgbossResult
	if err := runNode(ctx, d.dir, "pg-boss", cfg, &res); err != nil {
		return nil, err
	}
	if res.OrderViolations > 0 {
		return nil, fmt.Errorf("pg-boss delivered %d jobs out of per-key order under key_strict_fifo", res.OrderViolations)
	}
	return &res, nil
}

// sendRate times events pg-boss send() calls (batch 0) made by callers
// concurrent loops, or insert() calls of batch jobs each, one job per
// tenant per call; jobs per second.
func (d *pgbossDriver) sendRate(ctx context.Context, dsn string, events, tenants, callers, batch int) (float64, error) {
	conn, err := nodeConnection(dsn)
	if err != nil {
		return 0, err
	}
	cfg := map[string]any{"mode": "send", "connection": conn, "events": events, "tenants": tenants, "callers": callers, "batch": batch, "workers": callers}
	var res sendResult
	if err := runNode(ctx, d.dir, "pg-boss", cfg, &res); err != nil {
		return 0, err
	}
	return res.rate(events)
}

// sendResult is what a driver prints for a send mode.
type sendResult struct {
	Events int     `json:"events"`
	MS     float64 `json:"ms"`
	Error  string  `json:"error"`
}

func (r *sendResult) driverError() string { return r.Error }

// rate checks that all events were sent and returns events per second.
func (r *sendResult) rate(events int) (float64, error) {
	if r.Events != events || r.MS <= 0 {
		return 0, fmt.Errorf("driver sent %d of %d events in %.0f ms", r.Events, events, r.MS)
	}
	return float64(events) / (r.MS / 1000), nil
}

// tail returns the last 2000 bytes of s.
func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}

// rate is the drain rate: jobs handled per second from the first handler
// call to the end (all handled, or the budget spent).
func (r *pgbossResult) rate() float64 {
	return float64(r.Handled) / ((r.WorkMS - r.FirstMS) / 1000)
}
