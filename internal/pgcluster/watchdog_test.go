package pgcluster_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgque/pgque/internal/pgcluster"
	"github.com/pgque/pgque/internal/testing/pgtest"
)

// orphanEnv makes the test binary start a cluster, print its directory and
// exit without stopping it: a test binary that died mid-run.
const orphanEnv = "PGCLUSTER_TEST_ORPHAN"

func init() {
	if os.Getenv(orphanEnv) == "" {
		return
	}
	c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(c.Dir())
	os.Exit(0)
}

func TestWatchdogRemovesOrphanedCluster(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("orphaning a cluster: %v: %s", err, out)
	}
	dir := strings.TrimSpace(strings.Split(string(out), "\n")[0])
	if !strings.HasPrefix(dir, "/") {
		t.Fatalf("orphaning a cluster: %s", out)
	}
	pid := postmasterPID(t, dir)
	pgtest.WaitFor(t, 30*time.Second, fmt.Sprintf("the watchdog to remove cluster directory %s after its creator exited", dir), func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, fs.ErrNotExist)
	})
	if pid > 0 && processRunning(pid) {
		t.Errorf("postmaster %d still runs after the watchdog cleaned up", pid)
	}
}

// postmasterPID reads the pid from the cluster's postmaster.pid, or 0.
func postmasterPID(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open(dir + "/data/postmaster.pid")
	if err != nil {
		return 0
	}
	defer f.Close()
	var pid int
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		fmt.Sscan(sc.Text(), &pid)
	}
	return pid
}

// processRunning reports whether pid is a live, non-zombie process.
func processRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}
