package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Shutdown modes accepted by Restart, as in pg_ctl stop -m.
const (
	// ModeFast disconnects clients, rolls back their transactions and shuts
	// down cleanly with a checkpoint.
	ModeFast = "fast"
	// ModeImmediate aborts every server process without a checkpoint, so the
	// next start runs crash recovery, as after a power cut.
	ModeImmediate = "immediate"
)

// waitSeconds bounds how long pg_ctl waits for a start or stop.
const waitSeconds = "120"

// Restart stops the server with mode (ModeImmediate or ModeFast) and starts
// it again on the same directory and port. It also starts a server that
// Kill left dead. Existing connections are broken; new ones work once
// Restart returns.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if mode != ModeImmediate && mode != ModeFast {
		return fmt.Errorf("restarting cluster: unknown shutdown mode %q (want %q or %q)",
			mode, ModeImmediate, ModeFast)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return errors.New("restarting cluster: it was stopped and removed")
	}
	if c.running(ctx) {
		if err := c.stop(ctx, mode); err != nil {
			return fmt.Errorf("restarting cluster: %w", err)
		}
	}
	if err := c.start(ctx); err != nil {
		return fmt.Errorf("restarting cluster: %w", err)
	}
	return nil
}

// Stop shuts the server down (fast mode, falling back to Kill) and removes
// the cluster's directory. It is idempotent.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	var errs []error
	if c.running(ctx) {
		if err := c.stop(ctx, ModeFast); err != nil {
			errs = append(errs, err)
			errs = append(errs, c.kill())
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing cluster directory: %w", err))
	}
	c.removed = true
	stopWatchdog(c.watchdog)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping cluster: %w", err)
	}
	return nil
}

// initdb creates the data directory.
func (c *Cluster) initdb(ctx context.Context) error {
	_, err := c.run(ctx, "initdb", "-D", c.DataDir(), "-U", Superuser,
		"--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync")
	if err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	return nil
}

// start starts the server and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	_, err := c.run(ctx, "pg_ctl", "start", "-D", c.DataDir(), "-l", c.LogPath(),
		"-w", "-t", waitSeconds)
	if err != nil {
		return fmt.Errorf("starting postgres: %w\nserver log (%s) ends with:\n%s",
			err, c.LogPath(), c.LogTail(40))
	}
	return nil
}

// stop shuts the server down with mode and waits until it is gone.
func (c *Cluster) stop(ctx context.Context, mode string) error {
	_, err := c.run(ctx, "pg_ctl", "stop", "-D", c.DataDir(), "-m", mode,
		"-w", "-t", waitSeconds)
	if err != nil {
		return fmt.Errorf("stopping postgres (%s): %w", mode, err)
	}
	return nil
}

// running reports whether a server is running on the data directory.
func (c *Cluster) running(ctx context.Context) bool {
	_, err := c.run(ctx, "pg_ctl", "status", "-D", c.DataDir())
	return err == nil
}

// run runs a server binary as the server user, sending its output to the
// log writer, and returns the output; a failure's error includes it.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	cmd.Env = serverEnv(c.dir)
	cmd.Stdout = io.MultiWriter(&out, c.log)
	cmd.Stderr = cmd.Stdout
	cmd.SysProcAttr = c.user.sysProcAttr()
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, args[0], err,
			strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

// serverEnv is the caller's environment without PG* variables, which would
// redirect pg_ctl (PGDATA, PGPORT, ...), and with HOME set to the cluster
// directory, which the server user can read.
func serverEnv(home string) []string {
	env := []string{"HOME=" + home}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// LogTail returns at most the last n lines of the server log, or a note
// saying why it cannot be read.
func (c *Cluster) LogTail(n int) string {
	b, err := os.ReadFile(c.LogPath())
	if err != nil {
		return fmt.Sprintf("(server log unavailable: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
