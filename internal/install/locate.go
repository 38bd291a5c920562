package install

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// fileHeader starts each file's section of the install script (see
// sqlfiles.Script).
const fileHeader = "\n-- ==== "

// locate names the SQL file and line of a script error when PostgreSQL
// reports where in the script it happened, keeping err in the chain.
func locate(script string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Position <= 0 {
		return err
	}
	file, line, ok := position(script, int(pgErr.Position))
	if !ok {
		return err
	}
	return fmt.Errorf("%s line %d: %w", file, line, err)
}

// position maps a 1-based character position in script to the file section
// holding it and the line within that file.
func position(script string, pos int) (file string, line int, ok bool) {
	offset, chars := -1, 0
	for i := range script { // i steps over characters, as PostgreSQL counts
		chars++
		if chars == pos {
			offset = i
			break
		}
	}
	if offset < 0 {
		return "", 0, false
	}
	before := script[:offset]
	h := strings.LastIndex(before, fileHeader)
	if h < 0 {
		return "", 0, false
	}
	header, body, found := strings.Cut(before[h+len(fileHeader):], "\n")
	if !found {
		return "", 0, false
	}
	return strings.TrimSuffix(header, " ===="), strings.Count(body, "\n") + 1, true
}
