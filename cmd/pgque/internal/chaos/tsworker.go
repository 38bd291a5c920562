package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// TypeScript worker processes: the runner can start some of its workers as
// Node.js processes running the TypeScript package's work() (the script
// clients/typescript/test/chaos_worker.ts, compiled by `npm run build`).
// They are workers like the Go ones: slots w<i> after the Go workers', the
// same ProcConfig in the environment, the same record files, the same
// faults (kill -9, SIGSTOP, PgBouncer for every other one) and the same
// checker. The consumer group is then mixed, which is the point: Go and
// TypeScript workers take slots over from each other.

// DefaultTSWorkerScript is where `npm run build` puts the TypeScript chaos
// worker, relative to the repository's root.
const DefaultTSWorkerScript = "clients/typescript/dist/test/chaos_worker.js"

// minNodeMajor is the oldest Node.js the TypeScript package supports.
const minNodeMajor = 20

// tsWorkerCommand checks that Node.js and the built worker script are
// there and returns the command that starts a TypeScript worker. A run
// asked for TypeScript workers fails here rather than run without them.
func tsWorkerCommand(script string) ([]string, error) {
	if script == "" {
		script = DefaultTSWorkerScript
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("TypeScript workers need Node.js %d or newer (node) on PATH: %w", minNodeMajor, err)
	}
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		return nil, fmt.Errorf("TypeScript workers: running %s: %w", node, err)
	}
	version := string(bytes.TrimSpace(out))
	major, err := strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	if err != nil || major < minNodeMajor {
		return nil, fmt.Errorf("TypeScript workers need Node.js %d or newer; %s is %q", minNodeMajor, node, version)
	}
	abs, err := filepath.Abs(script)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("TypeScript workers need the built package (cd clients/typescript && npm ci && npm run build): %w", err)
	}
	return []string{node, abs}, nil
}

// isTSWorker reports whether the worker in slot index idx is a TypeScript
// one: they come after the Go workers.
func (o Options) isTSWorker(idx int) bool { return idx >= o.Workers }

// allWorkers is the number of worker processes, Go and TypeScript.
func (o Options) allWorkers() int { return o.Workers + o.TSWorkers }

// tsProc reports whether proc (an incarnation id such as "w5.2") is one of
// a TypeScript worker.
func (o Options) tsProc(proc string) bool {
	slot, _, _ := strings.Cut(proc, ".")
	if !strings.HasPrefix(slot, "w") {
		return false
	}
	idx, err := strconv.Atoi(slot[1:])
	return err == nil && o.isTSWorker(idx)
}

// pickWorker chooses the worker a fault of kind (a kill or a freeze)
// hits. With TypeScript workers each kind alternates between the
// languages, its first hitting a TypeScript worker, so that even a short
// run takes slots over from each side; the worker within a language is
// drawn at random. Only the fault scheduler calls it.
func (r *runner) pickWorker(kind string) int {
	o := r.o
	if r.picks == nil {
		r.picks = map[string]int{}
	}
	r.picks[kind]++
	if o.TSWorkers == 0 || (r.picks[kind]%2 == 0 && o.Workers > 0) {
		return r.rng.IntN(o.Workers)
	}
	return o.Workers + r.rng.IntN(o.TSWorkers)
}
