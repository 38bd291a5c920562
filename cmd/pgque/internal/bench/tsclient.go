package bench

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The TypeScript client's side of the ts suite: a Node script
// (tsclient/driver.mjs, embedded and written to the cache like pg-boss's)
// that imports the package built from this checkout's clients/typescript
// by the path of its dist/src/index.js, and node-postgres from that
// package's node_modules. The bench builds the package when dist is
// missing or older than its sources, so a fresh clone needs nothing but
// Node.js and npm; it does not use a packed tarball, which would have to
// be rebuilt and reinstalled after every change to the worker.

//go:embed tsclient/driver.mjs
var tsFiles embed.FS

// tsBuildHint is the command that builds the package by hand.
const tsBuildHint = "cd clients/typescript && npm ci && npm run build"

// tsDriver is a built TypeScript package and the driver that runs it.
type tsDriver struct {
	dir  string // the cached driver
	pkg  string // clients/typescript/dist/src/index.js
	node string // `node --version`
}

// findTSPackage returns the clients/typescript directory of the pgque
// checkout the bench runs in: searched from the working directory upwards,
// then next to this source file (a binary built from a checkout and run
// elsewhere).
func findTSPackage() (string, error) {
	var tried []string
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			tried = append(tried, d)
			if isTSPackage(filepath.Join(d, "clients", "typescript")) {
				return filepath.Join(d, "clients", "typescript"), nil
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		d := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "clients", "typescript")
		if isTSPackage(d) {
			return filepath.Clean(d), nil
		}
	}
	return "", fmt.Errorf("%w: the ts suite needs a pgque checkout: clients/typescript/package.json not found in %s or their parents; run the bench from the repository",
		errSkipped, strings.Join(tried[:min(1, len(tried))], ""))
}

func isTSPackage(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	return err == nil && strings.Contains(string(b), `"name": "pgque"`)
}

// setupTS finds node and the package, builds the package if dist is
// missing or stale (npm ci when node_modules is missing, then npm run
// build), and writes the driver into the cache.
func setupTS(ctx context.Context, e *env) (*tsDriver, error) {
	node, err := nodeVersion(ctx, "the ts suite needs Node.js 20 or newer and npm (node is not on PATH)")
	if err != nil {
		return nil, err
	}
	if !versionAtLeast(node, 20, 0) {
		return nil, fmt.Errorf("%w: the TypeScript package needs Node.js 20 or newer, node is %s", errSkipped, node)
	}
	pkgDir, err := findTSPackage()
	if err != nil {
		return nil, err
	}
	nodeSetup.Lock()
	defer nodeSetup.Unlock()
	index := filepath.Join(pkgDir, "dist", "src", "index.js")
	stale, why, err := tsStale(pkgDir, index)
	if err != nil {
		return nil, err
	}
	if stale {
		npm, err := exec.LookPath("npm")
		if err != nil {
			return nil, fmt.Errorf("%w: the TypeScript package must be built (%s) and npm is not on PATH; run: %s", errSkipped, why, tsBuildHint)
		}
		var steps [][]string
		if _, err := os.Stat(filepath.Join(pkgDir, "node_modules", "typescript", "package.json")); err != nil {
			steps = append(steps, []string{"ci", "--no-audit", "--no-fund", "--loglevel=error"})
		}
		steps = append(steps, []string{"run", "build"})
		for _, args := range steps {
			e.logf("   building the TypeScript package (%s): npm %s in %s", why, strings.Join(args, " "), pkgDir)
			cmd := exec.CommandContext(ctx, npm, args...)
			cmd.Dir = pkgDir
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("%w: npm %s in %s failed: %v: %s; run by hand: %s", errSkipped, args[0], pkgDir, err, tail(strings.TrimSpace(string(out))), tsBuildHint)
			}
		}
		if stale, why, err = tsStale(pkgDir, index); err != nil || stale {
			return nil, fmt.Errorf("%w: the TypeScript package is still not built after npm run build (%s, %v); run: %s", errSkipped, why, err, tsBuildHint)
		}
	}
	dir, err := cacheEmbedded(tsFiles, "tsclient", "bench-ts-", "driver.mjs")
	if err != nil {
		return nil, err
	}
	return &tsDriver{dir: dir, pkg: index, node: node}, nil
}

// tsStale reports whether index (the built package) is missing or older
// than a file it is built from: the package's sources, its manifest and
// build configuration, and the SQL of sql/ it bundles.
func tsStale(pkgDir, index string) (bool, string, error) {
	built, err := os.Stat(index)
	if err != nil {
		return true, "dist/src/index.js is missing", nil
	}
	var newer string
	check := func(path string) error {
		return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || newer != "" {
				return err
			}
			if info, err := d.Info(); err == nil && info.ModTime().After(built.ModTime()) {
				newer = p
			}
			return nil
		})
	}
	for _, p := range []string{"src", "scripts", "package.json", "package-lock.json", "tsconfig.json", filepath.Join("..", "..", "sql")} {
		if err := check(filepath.Join(pkgDir, p)); err != nil {
			return false, "", fmt.Errorf("checking whether the TypeScript package is built: %w", err)
		}
		if newer != "" {
			return true, newer + " is newer than dist", nil
		}
	}
	return false, "", nil
}

// tsWorkResult is what the driver prints for mode work.
type tsWorkResult struct {
	Handled         int     `json:"handled"`
	WorkMS          float64 `json:"work_ms"`
	OrderViolations int     `json:"order_violations"`
	RSSPeak         float64 `json:"rss_peak"`
	CPUMS           float64 `json:"cpu_ms"`
	Errors          int     `json:"errors"`
	Error           string  `json:"error"`
}

func (r *tsWorkResult) driverError() string { return r.Error }

// work drains queue (loaded by the caller with lanePayload events, slots
// subscribed for consumer "workers") with work() over slots slots and the
// given handler concurrency (0: the package's default).
func (d *tsDriver) work(ctx context.Context, dsn, queue string, slots, concurrency, events int, cost time.Duration) (*tsWorkResult, error) {
	conn, err := nodeConnection(dsn)
	if err != nil {
		return nil, err
	}
	budget := drainTimeout(events, cost, max(slots, concurrency))
	cfg := map[string]any{
		"pkg": d.pkg, "mode": "work", "connection": conn, "queue": queue, "consumer": "workers",
		"slots": slots, "events": events, "handlerMs": cost.Milliseconds(), "timeoutMs": budget.Milliseconds(),
		"poolMax": slots + 4,
	}
	if concurrency > 0 {
		cfg["concurrency"] = concurrency
	}
	var res tsWorkResult
	if err := runNode(ctx, d.dir, "TypeScript", cfg, &res); err != nil {
		return nil, err
	}
	if res.OrderViolations > 0 {
		return nil, fmt.Errorf("the TypeScript worker delivered %d events out of per-key order, twice, or overlapping their key", res.OrderViolations)
	}
	if res.Handled != events || res.WorkMS <= 0 {
		return nil, fmt.Errorf("the TypeScript worker handled %d of %d events in %.0f ms", res.Handled, events, res.WorkMS)
	}
	return &res, nil
}

// sendRate times events send() calls from callers concurrent loops on a
// pg.Pool (batch 0), or sendBatch() calls of batch events one after
// another; events per second.
func (d *tsDriver) sendRate(ctx context.Context, dsn, queue string, events, tenants, callers, batch int) (float64, error) {
	conn, err := nodeConnection(dsn)
	if err != nil {
		return 0, err
	}
	mode := "send"
	if batch > 0 {
		mode = "sendBatch"
	}
	cfg := map[string]any{"pkg": d.pkg, "mode": mode, "connection": conn, "queue": queue,
		"events": events, "tenants": tenants, "callers": callers, "batch": batch, "poolMax": max(callers, 1) + 4}
	var res sendResult
	if err := runNode(ctx, d.dir, "TypeScript", cfg, &res); err != nil {
		return 0, err
	}
	return res.rate(events)
}

// tsSteady is the steady suite's TypeScript worker: the driver in mode
// steady, whose handler reports each event's latency on stdout until its
// stdin closes.
type tsSteady struct {
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan error // what the driver's end line said, once it exited
	once  sync.Once
	err   error
}

// tsSteadyLine is a JSON line of the driver in mode steady.
type tsSteadyLine struct {
	Ready      *bool  `json:"ready"`
	Handled    *int   `json:"handled"`
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error"`
	Error      string `json:"error"`
}

// startTSSteady starts work() over cfg.slots slots of consumer "c" of q
// (subscribed by the caller), with gatherReceives for the "tsgather"
// client, its handlers taking cfg.handle, on sessions
// named steadyAppConsumer, and waits until it owns every slot.
func startTSSteady(ctx context.Context, d *tsDriver, dsn, q string, cfg steadyConfig, lat *latencyLog) (steadyConsumer, error) {
	conn, err := nodeConnection(dsn)
	if err != nil {
		return nil, err
	}
	arg, _ := json.Marshal(map[string]any{
		"pkg": d.pkg, "mode": "steady", "connection": conn, "queue": q, "consumer": "c", "slots": cfg.slots,
		"handlerMs": cfg.handle.Milliseconds(), "poolMax": cfg.slots + 4, "applicationName": steadyAppConsumer,
		"gather": cfg.client == "tsgather",
	})
	// Not bound to ctx: stop ends it by closing its stdin, so that it stops
	// its worker and says how that went.
	cmd := exec.Command("node", "driver.mjs", string(arg))
	cmd.Dir = d.dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: starting node: %v", errSkipped, err)
	}
	t := &tsSteady{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	ready := make(chan bool, 1)
	go func() {
		var end *tsSteadyLine
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Bytes()
			if len(line) > 0 && line[0] == '{' {
				var m tsSteadyLine
				if json.Unmarshal(line, &m) == nil {
					if m.Ready != nil {
						ready <- *m.Ready
					} else {
						end = &m
					}
				}
				continue
			}
			seq, ms, ok := strings.Cut(string(line), " ")
			n, err1 := strconv.Atoi(seq)
			v, err2 := strconv.ParseFloat(ms, 64)
			if ok && err1 == nil && err2 == nil {
				lat.recordMs(n, v)
			}
		}
		werr := cmd.Wait()
		switch {
		case end == nil:
			t.done <- fmt.Errorf("the TypeScript worker ended without a result (%v): %s", werr, tail(stderr.String()))
		case end.Error != "":
			t.done <- fmt.Errorf("the TypeScript worker failed: %s", end.Error)
		case end.Errors > 0:
			t.done <- fmt.Errorf("the TypeScript worker reported %d errors, the first: %s", end.Errors, end.FirstError)
		default:
			t.done <- werr
		}
	}()
	timer := time.NewTimer(60 * time.Second)
	defer timer.Stop()
	select {
	case ok := <-ready:
		if ok {
			return t, nil
		}
		return nil, errors.Join(fmt.Errorf("the TypeScript worker did not own its %d slots", cfg.slots), t.stop(ctx))
	case err := <-t.done:
		return nil, fmt.Errorf("the TypeScript worker stopped before it was ready: %v", err)
	case <-timer.C:
		return nil, errors.Join(fmt.Errorf("the TypeScript worker did not own its %d slots within 60s", cfg.slots), t.stop(ctx))
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), t.stop(ctx))
	}
}

// stop closes the driver's stdin and waits (at most 30 s, then kills it)
// for it to stop its worker and exit.
func (t *tsSteady) stop(context.Context) error {
	t.once.Do(func() {
		_ = t.stdin.Close()
		timer := time.NewTimer(30 * time.Second)
		defer timer.Stop()
		select {
		case t.err = <-t.done:
		case <-timer.C:
			_ = t.cmd.Process.Kill()
			t.err = errors.New("the TypeScript worker did not stop within 30s: killed")
		}
	})
	return t.err
}
