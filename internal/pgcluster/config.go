package pgcluster

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// writeConfig appends the base settings, then the caller's extra settings
// (later lines win in postgresql.conf), to the data directory's config file.
func writeConfig(dataDir string, base, extra map[string]string) error {
	var b strings.Builder
	b.WriteString("\n# Added by pgque's pgcluster: a throwaway cluster, not durable.\n")
	for _, m := range []map[string]string{base, extra} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, "%s = %s\n", k, quoteConfValue(m[k]))
		}
	}
	path := filepath.Join(dataDir, "postgresql.conf")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// quoteConfValue quotes a postgresql.conf value; every parameter type accepts
// a quoted value.
func quoteConfValue(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}
