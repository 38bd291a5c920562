package pgcluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Kill crashes the server at once: SIGKILL to the postmaster and every one of
// its child processes, with no shutdown of any kind. The data directory stays;
// Restart then runs crash recovery, and Stop removes everything. Killing a
// server that is not running is not an error.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return nil
	}
	return c.kill()
}

// kill is Kill without the lock.
func (c *Cluster) kill() error {
	pid, err := c.postmasterPID()
	if err != nil || !alive(pid) {
		return nil // no pid file or no process: nothing runs
	}
	victims := append([]int{pid}, childrenOf(pid)...)
	var errs []error
	for _, p := range victims {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("killing pid %d: %w", p, err))
		}
	}
	// The next start refuses to run while an old process still holds the
	// shared memory, so wait until they are all gone.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range victims {
		for alive(p) {
			if time.Now().After(deadline) {
				return errors.Join(append(errs, fmt.Errorf("pid %d survived SIGKILL", p))...)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// A killed postmaster may linger as a zombie until it is reaped, and both
	// pg_ctl and the next postmaster treat a lock file naming a pid that
	// kill(pid, 0) reaches as a running server. Every process is dead now,
	// so the lock files are stale: remove them.
	errs = append(errs, c.removeLockFiles())
	return errors.Join(errs...)
}

// removeLockFiles removes postmaster.pid and the socket lock files.
func (c *Cluster) removeLockFiles() error {
	locks, _ := filepath.Glob(filepath.Join(c.dir, ".s.PGSQL.*.lock"))
	locks = append(locks, filepath.Join(c.DataDir(), "postmaster.pid"))
	var errs []error
	for _, l := range locks {
		if err := os.Remove(l); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// postmasterPID reads the postmaster's pid from postmaster.pid.
func (c *Cluster) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != "Z" && state != "X"
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(p); ok && ppid == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

// procStat returns a process's state letter and parent pid from
// /proc/<pid>/stat.
func procStat(pid int) (state string, ppid int, ok bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return "", 0, false
	}
	// The command name is parenthesized and may contain spaces: parse after it.
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return "", 0, false
	}
	fields := strings.Fields(line[i+1:])
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, err = strconv.Atoi(fields[1])
	return fields[0], ppid, err == nil
}
