// Package sqlfiles holds pgque's SQL source, embedded into the binary.
//
// The SQL is split the way PgQ splits it: one folder per layer (engine, api,
// partition), tables under structure/, one function family per file under
// functions/. The ordered manifest install.list stitches the files together;
// the installer applies them, in that order, in one transaction. Every file
// is idempotent (create ... if not exists, create or replace), so the same
// script installs a fresh database and upgrades an existing one in place.
package sqlfiles

// The read path's *.gen.sql files are rendered from templates/ (see
// internal/sqlgen); `make lint` fails when they are stale.
//go:generate go run ../internal/sqlgen

import (
	"bufio"
	"embed"
	"fmt"
	"strings"
)

// Version is the schema version the embedded SQL installs. The installer
// records it in pgque.version.
const Version = "0.1.0"

//go:embed install.list engine api partition
var fsys embed.FS

// The queries the clients run before they trust schema pgque (client/):
// catalog reads only, shared with the TypeScript package, which bundles
// the same files.
//
//go:embed client
var clientFS embed.FS

// ClientQuery returns the query in client/<name>.sql. It panics on a name
// without a file: the names are the callers' constants.
func ClientQuery(name string) string {
	b, err := clientFS.ReadFile("client/" + name + ".sql")
	if err != nil {
		panic(fmt.Sprintf("sqlfiles: no client query %q: %v", name, err))
	}
	return string(b)
}

// File is one SQL source file of the install script.
type File struct {
	// Name is the path inside sql/, e.g. "engine/functions/pgque.ticker.sql".
	Name string
	// Body is the file's SQL text.
	Body string
}

// Files returns the install script's files in manifest order.
func Files() ([]File, error) {
	manifest, err := fsys.ReadFile("install.list")
	if err != nil {
		return nil, fmt.Errorf("reading install.list: %w", err)
	}
	var files []File
	sc := bufio.NewScanner(strings.NewReader(string(manifest)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		body, err := fsys.ReadFile(line)
		if err != nil {
			return nil, fmt.Errorf("install.list names %s: %w", line, err)
		}
		files = append(files, File{Name: line, Body: string(body)})
	}
	return files, sc.Err()
}

// Script returns the whole install script as one text, each file preceded by
// a comment naming it. It is what `pgque sql` prints for psql -1 -f.
func Script() (string, error) {
	files, err := Files()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "-- pgque %s install script; apply in one transaction (psql -1 -f).\n", Version)
	b.WriteString("set local client_min_messages = warning;\n")
	for _, f := range files {
		fmt.Fprintf(&b, "\n-- ==== %s ====\n%s\n", f.Name, f.Body)
	}
	fmt.Fprintf(&b, "\n-- ==== version ====\nselect pgque._record_version('%s');\n", Version)
	return b.String(), nil
}
