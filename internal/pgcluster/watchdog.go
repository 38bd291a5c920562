package pgcluster

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// watchdogScript runs beside a cluster and tears it down once the process
// that started it is gone without calling Stop (a test binary that timed out
// or panicked, a demo killed with ^C): SIGQUIT to the postmaster is an
// immediate shutdown, after which the directory is removed. $1 is the pid to
// watch, $2 the cluster directory.
const watchdogScript = `
while kill -0 "$1" 2>/dev/null; do sleep 1; done
pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do
	kill -0 "$pid" 2>/dev/null || break
	sleep 1
done
rm -rf "$2"
`

// startWatchdog starts the watchdog in a session of its own, so that a ^C
// sent to the caller's process group does not end it too. It returns nil if
// the watchdog cannot start: the cluster then works without that safety net.
func startWatchdog(dir string) *exec.Cmd {
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "pgque-cluster-watchdog",
		strconv.Itoa(os.Getpid()), dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil
	}
	return cmd
}

// stopWatchdog ends the watchdog after a regular Stop.
func stopWatchdog(cmd *exec.Cmd) {
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}
