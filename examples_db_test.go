package pgque_test

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// databaseURL stands, in the examples, for the application's own database
// URL: it returns the DSN of a database with pgque installed, made by the
// test harness on first use and shared by all examples.
func databaseURL() string {
	exampleDB.once.Do(func() { exampleDB.dsn = pgtest.NewInstalledDB(&exampleDB.tb) })
	return exampleDB.dsn
}

var exampleDB struct {
	once sync.Once
	dsn  string
	tb   harnessTB
}

// harnessTB lets Example functions, which get no *testing.T, use the
// harness. It implements the testing.TB methods pgtest calls; the embedded
// nil testing.TB only satisfies the interface. The example database is
// never dropped explicitly: it goes with the throwaway cluster (with
// PGQUE_TEST_DSN it stays behind, named pgque_examples_...).
type harnessTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
}

func (h *harnessTB) Helper()        {}
func (h *harnessTB) Name() string   { return "examples" }
func (h *harnessTB) Fatal(a ...any) { panic(fmt.Sprint(a...)) }
func (h *harnessTB) Fatalf(f string, a ...any) {
	panic(fmt.Sprintf(f, a...))
}
func (h *harnessTB) Error(a ...any) { fmt.Fprintln(os.Stderr, a...) }
func (h *harnessTB) Errorf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, f+"\n", a...)
}
func (h *harnessTB) Log(a ...any)             { fmt.Fprintln(os.Stderr, a...) }
func (h *harnessTB) Logf(f string, a ...any)  { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (h *harnessTB) Cleanup(f func())         { h.mu.Lock(); h.cleanups = append(h.cleanups, f); h.mu.Unlock() }
func (h *harnessTB) Failed() bool             { return false }
func (h *harnessTB) Skipped() bool            { return false }
func (h *harnessTB) TempDir() string          { return os.TempDir() }
func (h *harnessTB) Setenv(key, value string) { _ = os.Setenv(key, value) }
func (h *harnessTB) Skip(a ...any)            { panic(fmt.Sprint(a...)) }
func (h *harnessTB) Skipf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (h *harnessTB) FailNow()                 { panic("FailNow") }
func (h *harnessTB) Fail()                    {}
func (h *harnessTB) SkipNow()                 { panic("SkipNow") }
