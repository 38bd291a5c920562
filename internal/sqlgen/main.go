// Command sqlgen writes the read path's SQL files from their template.
//
// The read path's hottest functions (_deliver_raw, receive_raw,
// receive_partitioned_raw) share one PL/pgSQL body: one function returning
// another's rows would copy every row into a second result store, so each
// entry point carries the body itself. The body lives once, in
// sql/templates/deliver_raw.sql.tmpl; this command renders it into plain SQL
// files (named *.gen.sql) that are checked in and applied by the installer
// like any other file, so the SQL the database runs can be read, grepped
// and reviewed as it is. Run it with `go generate ./sql`.
//
// With -out DIR it writes the files under DIR instead (scripts/sqlgen-check,
// run by `make lint`, renders into a temporary folder and compares). With
// -copies it writes nothing and fails when a hand-written SQL file holds a
// run of a generated body's lines: a copy that would drift from the
// template.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

// templateFile is the template's path inside sql/.
const templateFile = "templates/deliver_raw.sql.tmpl"

// generatedSuffix names every generated file, so that a reader (and the
// copy check) can tell them from the hand-written ones.
const generatedSuffix = ".gen.sql"

// entry is one rendering of the body: the entry point it becomes.
type entry struct {
	// Public is receive_raw: a consumer's own entry point, with its access
	// checks. Lease is receive_partitioned_raw: the lease proved first,
	// the epoch on every row. Neither: _deliver_raw.
	Public, Lease bool
	// Queue and NSlots are how the chunk statements name the queue id and
	// the slot count: the body's variables, or a reader's format()
	// placeholders. Mod is the modulo operator as the output must spell it
	// (doubled in a format() string).
	Queue, NSlots, Mod string
	// Rows names the row set a "read" statement reads: rows, rrows, wrows.
	Rows string
}

// With returns the entry reading the row set rows.
func (e entry) With(rows string) entry {
	e.Rows = rows
	return e
}

// entries are what the file templates render.
var entries = struct {
	Deliver, Receive, Partitioned, Reader entry
}{
	Deliver:     entry{Queue: "v_queue", NSlots: "i_nslots", Mod: "%"},
	Receive:     entry{Public: true, Queue: "v_queue", NSlots: "i_nslots", Mod: "%"},
	Partitioned: entry{Lease: true, Queue: "v_queue", NSlots: "i_nslots", Mod: "%"},
	Reader:      entry{Queue: "%1$s", NSlots: "%2$s", Mod: "%%"},
}

// outputs are the generated files, by path inside sql/; each is the
// template of the same name.
var outputs = []string{
	"api/functions/pgque.deliver_raw.gen.sql",
	"partition/functions/pgque.receive_partitioned_raw.gen.sql",
}

func main() {
	sqlDir := flag.String("sql", ".", "the sql/ folder: where the template is read from")
	outDir := flag.String("out", "", "where the generated files are written (default: the sql/ folder)")
	checkCopies := flag.Bool("copies", false, "write nothing; fail when a hand-written SQL file copies a generated body")
	flag.Parse()
	if *outDir == "" {
		*outDir = *sqlDir
	}
	if err := run(*sqlDir, *outDir, *checkCopies); err != nil {
		fmt.Fprintln(os.Stderr, "sqlgen:", err)
		os.Exit(1)
	}
}

func run(sqlDir, outDir string, checkCopies bool) error {
	tmpl, err := parse(sqlDir)
	if err != nil {
		return err
	}
	if checkCopies {
		problems, err := copies(sqlDir, tmpl)
		if err != nil {
			return err
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "\n"))
		}
		return nil
	}
	for _, name := range outputs {
		var b bytes.Buffer
		if err := tmpl.ExecuteTemplate(&b, name, entries); err != nil {
			return fmt.Errorf("rendering %s: %w", name, err)
		}
		path := filepath.Join(outDir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// parse reads the template.
func parse(sqlDir string) (*template.Template, error) {
	src, err := os.ReadFile(filepath.Join(sqlDir, filepath.FromSlash(templateFile)))
	if err != nil {
		return nil, fmt.Errorf("reading the template: %w", err)
	}
	tmpl, err := template.New(templateFile).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", templateFile, err)
	}
	return tmpl, nil
}

// copyRun is how many consecutive code lines of a chunk statement make a
// copy: a line or two (a visibility test, a window clause) may be shared
// by any reader of events; this many in a row are the statement itself.
const copyRun = 3

// statements returns the code lines of the read path's statements (the
// row sets and the chunk read over each, as the entry points and a reader
// render them), one slice per statement: what a copy would carry. The
// PL/pgSQL around them is left out: its state changes are the engine's
// idioms too (_finish makes the same ones).
func statements(tmpl *template.Template) ([][]string, error) {
	var out [][]string
	for _, e := range []entry{entries.Deliver, entries.Reader} {
		for _, rows := range []string{"rows", "rrows", "wrows"} {
			for _, name := range []string{rows, "read"} {
				var buf bytes.Buffer
				if err := tmpl.ExecuteTemplate(&buf, name, e.With(rows)); err != nil {
					return nil, fmt.Errorf("rendering %s: %w", name, err)
				}
				out = append(out, codeLines(buf.String()))
			}
		}
	}
	return out, nil
}

// codeLines returns text's lines, trimmed, without blank lines and --
// comments.
func codeLines(text string) []string {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "--") {
			lines = append(lines, l)
		}
	}
	return lines
}

// copies returns one message for each hand-written SQL file under sqlDir
// that holds copyRun consecutive code lines of a generated statement.
func copies(sqlDir string, tmpl *template.Template) ([]string, error) {
	bs, err := statements(tmpl)
	if err != nil {
		return nil, err
	}
	runs := map[string]bool{}
	for _, b := range bs {
		for i := 0; i+copyRun <= len(b); i++ {
			runs[strings.Join(b[i:i+copyRun], "\n")] = true
		}
	}
	var problems []string
	err = filepath.WalkDir(sqlDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") || strings.HasSuffix(path, generatedSuffix) {
			return err
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(sqlDir, path)
		lines := codeLines(string(text))
		for i := 0; i+copyRun <= len(lines); i++ {
			if runs[strings.Join(lines[i:i+copyRun], "\n")] {
				problems = append(problems, fmt.Sprintf("sql/%s copies the generated read path's body (edit sql/%s, which renders it, instead):\n\t%s",
					filepath.ToSlash(rel), templateFile, strings.Join(lines[i:i+copyRun], "\n\t")))
				break
			}
		}
		return nil
	})
	sort.Strings(problems)
	return problems, err
}
