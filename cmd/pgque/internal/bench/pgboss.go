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
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("%w: pg-boss needs Node.js and npm (node is not on PATH; install Node.js 20 or newer: pg-boss 12 declares 22.12 but runs on 20)", errSkipped)
	}
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("running node --version: %w", err)
	}
	h := sha256.New()
	var files []string
	for _, name := range []string{"driver.mjs", "package.json", "package-lock.json"} {
		b, err := pgbossFiles.ReadFile("pgboss/" + name)
		if err != nil {
			return nil, err
		}
		h.Write(b)
		files = append(files, name)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "pgque", "bench-pgboss-"+hex.EncodeToString(h.Sum(nil))[:12])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, name := range files {
		b, _ := pgbossFiles.ReadFile("pgboss/" + name)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return nil, err
		}
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
	return &pgbossDriver{dir: dir, node: strings.TrimSpace(string(out))}, nil
}

// pgbossResult is what driver.mjs prints.
type pgbossResult struct {
	Events          int     `json:"events"`
	Handled         int     `json:"handled"`
	TimedOut        bool    `json:"timed_out"`
	LoadMS          float64 `json:"load_ms"`
	WorkMS          float64 `json:"work_ms"`
	FirstMS         float64 `json:"first_ms"`
	OrderViolations int     `json:"order_violations"`
	Error           string  `json:"error"`
}

// run executes the per-tenant ordered workload against database dsn with
// workers local workers, each fetching up to batchSize jobs at a time and
// running them one after another. The drain stops after budget; the
// result then says how many jobs were handled (TimedOut).
func (d *pgbossDriver) run(ctx context.Context, dsn string, events, tenants, workers, batchSize int, cost, budget time.Duration) (*pgbossResult, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{
		"connection": map[string]any{
			"host": cc.Host, "port": cc.Port, "user": cc.User, "password": cc.Password, "database": cc.Database,
		},
		"events": events, "tenants": tenants, "workers": workers,
		"batchSize": batchSize, "handlerMs": cost.Milliseconds(),
		"timeoutMs": budget.Milliseconds(),
	}
	arg, _ := json.Marshal(cfg)
	cmd := exec.CommandContext(ctx, "node", "driver.mjs", string(arg))
	cmd.Dir = d.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var res pgbossResult
	line := strings.TrimSpace(stdout.String())
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if jerr := json.Unmarshal([]byte(line), &res); jerr != nil {
		return nil, fmt.Errorf("pg-boss driver: %v; stdout: %q; stderr: %q", errors.Join(runErr, jerr), tail(stdout.String()), tail(stderr.String()))
	}
	if res.Error != "" || runErr != nil {
		return nil, fmt.Errorf("pg-boss driver failed: %s %v; stderr: %q", res.Error, runErr, tail(stderr.String()))
	}
	if res.OrderViolations > 0 {
		return nil, fmt.Errorf("pg-boss delivered %d jobs out of per-key order under key_strict_fifo", res.OrderViolations)
	}
	return &res, nil
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
