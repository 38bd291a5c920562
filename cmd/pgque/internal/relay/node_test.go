package relay_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// needNode returns the node binary: the end-to-end tests need a real
// Node.js handler. In CI (CI=true) a missing node fails the test; locally
// the test is skipped with a message saying what to install.
func needNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is not on PATH: the relay end-to-end tests need Node.js 18 or later")
		}
		t.Skip("node is not on PATH: install Node.js 18 or later to run the relay end-to-end tests")
	}
	return node
}

// nodeHandler is testdata/handler.mjs running as its own process.
type nodeHandler struct {
	port   int
	record string
	cmd    *exec.Cmd
}

// startNodeHandler starts the handler with the given environment
// (MAX_LATENCY_MS, FAIL_EVERY) and waits for its port.
func startNodeHandler(t *testing.T, env ...string) *nodeHandler {
	t.Helper()
	node := needNode(t)
	h := &nodeHandler{record: filepath.Join(t.TempDir(), "record.jsonl")}
	h.cmd = exec.Command(node, "testdata/handler.mjs")
	h.cmd.Env = append(os.Environ(), append(env, "RECORD_FILE="+h.record)...)
	h.cmd.Stderr = testLog{t: t, prefix: "handler: "}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		_ = h.cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the handler's port: %v", err)
	}
	var hello struct{ Port int }
	if err := json.Unmarshal([]byte(line), &hello); err != nil || hello.Port == 0 {
		t.Fatalf("handler said %q, want {\"port\": N}", line)
	}
	h.port = hello.Port
	return h
}

// record is one line of the handler's record file.
type record struct {
	Ph            string  `json:"ph"`
	EvID          int64   `json:"ev_id"`
	Key           *string `json:"key"`
	Epoch         int64   `json:"epoch"`
	Slot          int     `json:"slot"`
	Retry         int     `json:"retry"`
	Status        int     `json:"status"`
	Overlap       bool    `json:"overlap"`
	CEID          string  `json:"ce_id"`
	CEType        string  `json:"ce_type"`
	CESource      string  `json:"ce_source"`
	CETime        string  `json:"ce_time"`
	CESpecVersion string  `json:"ce_specversion"`
	ContentType   string  `json:"content_type"`
}

// records reads the record file (a torn last line is left for later).
func (h *nodeHandler) records(t *testing.T) []record {
	t.Helper()
	b, err := os.ReadFile(h.record)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	var out []record
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			continue
		}
		out = append(out, r)
	}
	return out
}

// buildPgque builds the pgque binary once per test binary (without -race:
// the relays are the system under test, not this test's code).
var buildPgque = sync.OnceValues(func() (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir, err := os.MkdirTemp("", "pgque-relay-test-")
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "pgque")
	cmd := exec.Command(goBin, "build", "-o", out, "../..")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", &buildError{err: err, out: string(b)}
	}
	return out, nil
})

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return "building pgque: " + e.err.Error() + "\n" + e.out }

// testLog writes a process's output to the test log, line by line.
type testLog struct {
	t      *testing.T
	prefix string
}

func (w testLog) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // output after the test ended
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(p), nil
}

// relayProc is one `pgque relay` OS process.
type relayProc struct {
	worker string
	cmd    *exec.Cmd
	done   chan struct{}
}

// startRelay starts `pgque relay` with args.
func startRelay(t *testing.T, dsn, worker string, args ...string) *relayProc {
	t.Helper()
	bin, err := buildPgque()
	if err != nil {
		t.Fatal(err)
	}
	p := &relayProc{worker: worker, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"relay", "--dsn", dsn, "--worker", worker}, args...)...)
	p.cmd.Stderr = testLog{t: t, prefix: worker + ": "}
	p.cmd.Stdout = p.cmd.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// kill9 kills the relay without a chance to clean up.
func (p *relayProc) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}
