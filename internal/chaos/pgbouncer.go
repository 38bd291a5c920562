package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// PgBouncerPath is where the Debian package installs PgBouncer.
const PgBouncerPath = "/usr/sbin/pgbouncer"

// bouncer is a PgBouncer in transaction mode in front of one database. It
// runs as the unprivileged pgque OS user when the runner is root (PgBouncer,
// like Postgres, refuses to run as root).
type bouncer struct {
	dir  string
	port int
	cred *syscall.Credential

	mu  sync.Mutex
	cmd *exec.Cmd
	ran chan struct{}
}

// newBouncer writes the configuration for database dbname on the server at
// (pgHost, pgPort), reached as pgUser, into a new directory under /tmp (the
// unprivileged user must reach it; a test's temporary directory is private).
func newBouncer(pgHost string, pgPort int, dbname, pgUser string) (*bouncer, error) {
	dir, err := os.MkdirTemp("/tmp", "pgque-bouncer-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	b := &bouncer{dir: dir, port: freeTCPPort()}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("pgque")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return nil, fmt.Errorf("pgbouncer: no unprivileged user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		b.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
server_reset_query =
server_connect_timeout = 2
server_login_retry = 1
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
`, dbname, pgHost, pgPort, dbname, pgUser, b.port, filepath.Join(dir, "pgbouncer.log"))
	if err := os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644); err != nil {
		return nil, err
	}
	return b, nil
}

// DSN is the connection string clients use through the bouncer: the simple
// protocol, since PgBouncer 1.18 in transaction mode cannot keep prepared
// statements.
func (b *bouncer) DSN(dbname, user string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d dbname=%s user=%s sslmode=disable default_query_exec_mode=simple_protocol connect_timeout=5",
		b.port, dbname, user)
}

// start starts PgBouncer and waits until it accepts connections.
func (b *bouncer) start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	cmd := exec.Command(PgBouncerPath, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGKILL}
	out, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("starting pgbouncer: %w", err)
	}
	ran := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(ran) }()
	b.cmd, b.ran = cmd, ran
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", b.port), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ran:
			return fmt.Errorf("pgbouncer exited at start (see %s)", filepath.Join(b.dir, "pgbouncer.log"))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("pgbouncer did not listen on port %d within 10s", b.port)
}

// kill SIGKILLs PgBouncer and waits for it to die.
func (b *bouncer) kill() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	<-b.ran
	b.cmd = nil
}

// remove kills PgBouncer and removes its directory, keeping its log at
// keepLog when not "".
func (b *bouncer) remove(keepLog string) {
	b.kill()
	if keepLog != "" {
		if data, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log")); err == nil {
			_ = os.WriteFile(keepLog, data, 0o644)
		}
	}
	_ = os.RemoveAll(b.dir)
}

func freeTCPPort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 6432
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
