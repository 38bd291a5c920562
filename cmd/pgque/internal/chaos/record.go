package chaos

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// The recording store: every process appends JSON lines to a file of its
// own in the run directory, with one write(2) per record and no user-space
// buffer, so a record the process wrote survives its SIGKILL (and Postgres
// restarts, which it does not touch). Handler starts are written before the
// handler body runs.

// record is one line of a worker's file: a start ("s") carries the
// attempt, an end ("e") the outcome of attempt N of the same process.
type record struct {
	T string `json:"t"`
	N int64  `json:"n"`
	Attempt
}

// recorder appends records to one file.
type recorder struct {
	mu   sync.Mutex
	f    *os.File
	n    int64
	sync bool
	proc string
}

func openRecorder(path, proc string, fsync bool) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &recorder{f: f, sync: fsync, proc: proc}, nil
}

// start records the start of an attempt and returns its number.
func (r *recorder) start(a Attempt) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return r.n, r.write(record{T: "s", N: r.n, Attempt: a}, r.sync)
}

// end records the end of attempt n.
func (r *recorder) end(n int64, outcome string, at time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.write(record{T: "e", N: n, Attempt: Attempt{Proc: r.proc, Outcome: outcome, End: at}}, false)
}

// skipped records a skipped event (start and end at once).
func (r *recorder) skipped(a Attempt) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	a.Outcome, a.End = OutcomeSkipped, a.Start
	return r.write(record{T: "s", N: r.n, Attempt: a}, false)
}

func (r *recorder) write(rec record, fsync bool) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := r.f.Write(append(b, '\n')); err != nil {
		return err
	}
	if fsync {
		return r.f.Sync()
	}
	return nil
}

func (r *recorder) close() error { return r.f.Close() }

// attemptLoader reads the attempt files of a run directory incrementally:
// each call reads what was appended since the previous one.
type attemptLoader struct {
	dir     string
	offsets map[string]int64
	byProc  map[string]map[int64]int // proc -> n -> index in attempts
	// attempts holds every attempt read so far, ends merged in.
	attempts []Attempt
}

func newAttemptLoader(dir string) *attemptLoader {
	return &attemptLoader{dir: dir, offsets: map[string]int64{}, byProc: map[string]map[int64]int{}}
}

// load reads new records; a torn last line (a process killed mid-write)
// is left for the next call, and ignored at the end.
func (l *attemptLoader) load() error {
	files, err := filepath.Glob(filepath.Join(l.dir, "*.jsonl"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	for _, path := range files {
		if err := l.loadFile(path); err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
	}
	return nil
}

func (l *attemptLoader) loadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	off := l.offsets[path]
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return err
	}
	br := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return nil // a partial line waits for the rest
		}
		if err != nil {
			return err
		}
		off += int64(len(line))
		l.offsets[path] = off
		var rec record
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("bad record %q: %w", strings.TrimSpace(string(line)), err)
		}
		l.add(rec)
	}
}

func (l *attemptLoader) add(rec record) {
	m := l.byProc[rec.Proc]
	switch rec.T {
	case "s":
		if m == nil {
			m = map[int64]int{}
			l.byProc[rec.Proc] = m
		}
		m[rec.N] = len(l.attempts)
		l.attempts = append(l.attempts, rec.Attempt)
	case "e":
		if i, ok := m[rec.N]; ok {
			l.attempts[i].Outcome = rec.Outcome
			l.attempts[i].End = rec.End
		}
	}
}
