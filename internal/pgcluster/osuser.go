package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"sync"
	"syscall"
)

const (
	// ServerUserName is the OS user that runs the server when the caller is
	// root. It is created (a system user without a home) when missing.
	ServerUserName = "pgque"
	// FallbackServerUserName runs the server when ServerUserName can be
	// neither found nor created.
	FallbackServerUserName = "nobody"
)

// osUser is the identity the server commands run as.
type osUser struct {
	name     string
	uid, gid int
	// cred switches to name when the caller is root; nil runs as the caller.
	cred *syscall.Credential
}

// useraddLock serializes user creation across processes: concurrent useradd
// runs have been seen to lose each other's /etc/passwd updates.
const useraddLock = "/tmp/pgque-useradd.lock"

var (
	serverUserMu     sync.Mutex
	serverUserCached *osUser
)

// serverUser picks who runs initdb, pg_ctl and postgres. PostgreSQL refuses
// to run as root, so root callers drop to an unprivileged user. The choice is
// made once per process.
func serverUser() (*osUser, error) {
	serverUserMu.Lock()
	defer serverUserMu.Unlock()
	if serverUserCached != nil {
		return serverUserCached, nil
	}
	u, err := pickServerUser()
	if err != nil {
		return nil, err
	}
	serverUserCached = u
	return u, nil
}

// pickServerUser is serverUser without the memo.
func pickServerUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return &osUser{name: "(self)", uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := ensureUser(ServerUserName)
	if err != nil {
		u, err = user.Lookup(FallbackServerUserName)
		if err != nil {
			return nil, fmt.Errorf("finding an unprivileged user to run postgres as "+
				"(tried %s and %s): %w", ServerUserName, FallbackServerUserName, err)
		}
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("parsing ids of user %s: %w", u.Username, err)
	}
	return &osUser{
		name: u.Username,
		uid:  uid,
		gid:  gid,
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
	}, nil
}

// ensureUser looks name up and creates it when missing, holding a file lock
// so that concurrent test binaries create it once.
func ensureUser(name string) (*user.User, error) {
	if u, err := user.Lookup(name); err == nil {
		return u, nil
	}
	lock, err := os.OpenFile(useraddLock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", useraddLock, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("locking %s: %w", useraddLock, err)
	}
	if u, err := user.Lookup(name); err == nil {
		return u, nil // another process created it while we waited
	}
	out, err := exec.Command("useradd", "--system", "--no-create-home",
		"--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("useradd %s: %w: %s", name, err, out)
	}
	return user.Lookup(name)
}

// sysProcAttr returns the process attributes that run a command as u.
func (u *osUser) sysProcAttr() *syscall.SysProcAttr {
	if u.cred == nil {
		return nil
	}
	return &syscall.SysProcAttr{Credential: u.cred}
}
