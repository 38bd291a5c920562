package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
)

// tableCommand groups the commands that make a table's writes emit events
// (pgque.attach_table and friends).
func (a *app) tableCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "table",
		Short: "Emit events from a table's INSERT/UPDATE/DELETE (trigger-sourced queues)",
		Long: `A table attached to a queue emits one event per written row, from a trigger,
in the writing transaction: type insert, update or delete, the row as JSON,
the key column as partition key, the table in extra2. See docs/triggers.md.`,
	}
	cmd.AddCommand(a.tableAttachCommand(), a.tableDetachCommand(), a.tableListCommand())
	return cmd
}

func (a *app) tableAttachCommand() *cobra.Command {
	var (
		ops, columns, exclude []string
		when                  string
		keepUnchanged         bool
	)
	cmd := &cobra.Command{
		Use:   "attach <queue> <table> <key-column>",
		Short: "Attach a table: its writes emit events keyed by key-column",
		Long: `Attach creates the triggers that make every INSERT, UPDATE and DELETE on the
table emit an event into the queue. Run it as the table's owner (a role with
the TRIGGER privilege on it) holding pgque_admin; the table's writers need no
pgque grant. Attaching again replaces the options.

  pgque table attach files public.files tenant_id
  pgque table attach files public.files tenant_id --exclude secret --when 'new.size > 0' --ops insert,update`,
		Args: exactArgs("queue", "table", "key-column"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(columns) > 0 && len(exclude) > 0 {
				return usagef("--columns and --exclude cannot be combined: keep some columns or leave some out")
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			err = s.AttachTable(ctx, args[0], args[1], args[2], &pgque.AttachOptions{Operations: ops, Columns: columns,
				ExcludeColumns: exclude, When: when, KeepUnchanged: keepUnchanged})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "attached %s to queue %s (key %s; %s)\n", args[1], args[0], args[2], strings.Join(ops, ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&ops, "ops", []string{"insert", "update", "delete"}, "operations that emit events: insert, update, delete, truncate (without truncate, TRUNCATE is refused)")
	f.StringSliceVar(&columns, "columns", nil, "keep only these columns in the payload")
	f.StringSliceVar(&exclude, "exclude", nil, "leave these columns out of the payload")
	f.StringVar(&when, "when", "", "SQL condition on NEW/OLD, as in CREATE TRIGGER ... WHEN")
	f.BoolVar(&keepUnchanged, "keep-unchanged", false, "emit updates that change no kept column too")
	return cmd
}

func (a *app) tableDetachCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "detach <queue> <table>",
		Short: "Detach a table: its writes emit nothing more (events already sent stay)",
		Args:  exactArgs("queue", "table"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.DetachTable(ctx, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "detached %s from queue %s\n", args[1], args[0])
			return nil
		},
	}
}

// attachedTable is one row of pgque.attached_tables().
type attachedTable struct {
	Queue          string   `json:"queue"`
	Table          *string  `json:"table"`
	KeyColumn      string   `json:"key_column"`
	Operations     []string `json:"operations"`
	Columns        []string `json:"columns,omitempty"`
	ExcludeColumns []string `json:"exclude_columns,omitempty"`
	When           *string  `json:"when,omitempty"`
	SkipUnchanged  bool     `json:"skip_unchanged"`
}

func (a *app) tableListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List attached tables",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			tables, err := s.AttachedTables(ctx)
			if err != nil {
				return err
			}
			list := make([]attachedTable, len(tables))
			for i, t := range tables {
				list[i] = attachedTable{Queue: t.Queue, Table: nilIfEmpty(t.Table), KeyColumn: t.KeyColumn,
					Operations: t.Operations, Columns: t.Columns, ExcludeColumns: t.ExcludeColumns,
					When: nilIfEmpty(t.When), SkipUnchanged: t.SkipUnchanged}
			}
			if asJSON {
				if list == nil {
					list = []attachedTable{}
				}
				return a.printJSON(list)
			}
			out := make([][]string, 0, len(list))
			for _, t := range list {
				tbl := "(dropped)"
				if t.Table != nil {
					tbl = *t.Table
				}
				cols := "all"
				switch {
				case len(t.Columns) > 0:
					cols = strings.Join(t.Columns, ",")
				case len(t.ExcludeColumns) > 0:
					cols = "all but " + strings.Join(t.ExcludeColumns, ",")
				}
				when := "-"
				if t.When != nil {
					when = *t.When
				}
				out = append(out, []string{t.Queue, tbl, t.KeyColumn, strings.Join(t.Operations, ","), cols, when})
			}
			return table(a.stdout, []string{"QUEUE", "TABLE", "KEY", "OPERATIONS", "COLUMNS", "WHEN"}, out)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
