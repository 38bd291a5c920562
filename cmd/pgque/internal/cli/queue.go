package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
)

func (a *app) queueCommand() *cobra.Command {
	return group("queue", "Create, drop, list and configure queues",
		a.queueCreateCommand(), a.queueDropCommand(), a.queueListCommand(), a.queueConfigCommand())
}

func (a *app) queueCreateCommand() *cobra.Command {
	var sets []string
	cmd := &cobra.Command{
		Use:   "create <queue>",
		Short: "Create a queue (reports whether it already existed)",
		Args:  exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			params, err := parseSets(sets)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			created, err := s.CreateQueue(ctx, args[0])
			if err != nil {
				return err
			}
			if err := setConfig(ctx, s, args[0], params); err != nil {
				return err
			}
			if created {
				fmt.Fprintf(a.stdout, "created queue %s\n", args[0])
			} else {
				fmt.Fprintf(a.stdout, "queue %s already exists\n", args[0])
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&sets, "set", nil, "set a parameter, param=value (repeatable; see 'pgque queue config --help')")
	return cmd
}

func (a *app) queueDropCommand() *cobra.Command {
	var force, yes bool
	cmd := &cobra.Command{
		Use:   "drop <queue> --yes",
		Short: "Drop a queue and all its events",
		Args:  exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return usagef("dropping queue %s deletes all its events; pass --yes to confirm", args[0])
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.DropQueue(ctx, args[0], force); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "dropped queue %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "drop even while the queue has subscriptions")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm")
	return cmd
}

func (a *app) queueListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List queues with their rate, backlog and ticker lag",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			infos, err := s.queueInfos(ctx, "")
			if err != nil {
				return err
			}
			if asJSON {
				return a.printJSON(nonNil(infos))
			}
			rows := make([][]string, len(infos))
			for i, q := range infos {
				rows[i] = []string{q.Name, fmtRate(q.EvPerSec), strconv.FormatInt(q.Unticked, 10),
					fmtTickerLag(&q), strconv.FormatInt(q.RetryPending, 10), strconv.FormatInt(q.DeadLetters, 10)}
			}
			return table(a.stdout, []string{"QUEUE", "EV/S", "UNTICKED", "TICKER LAG", "RETRIES", "DEAD"}, rows)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the queues as JSON")
	return cmd
}

func (a *app) queueConfigCommand() *cobra.Command {
	var (
		sets   []string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "config <queue> [--set param=value]...",
		Short: "Show a queue's settings, or change them with --set",
		Long: `Config shows every setting of a queue. With --set param=value (repeatable) it
changes them first, all in one transaction. Parameters:

  ticker_max_count    tick after this many events (integer >= 1, default 500)
  ticker_max_lag      tick pending events after this long (interval, default 10 ms)
  ticker_idle_period  tick an idle queue this often (interval, default 60 s)
  rotation_period     switch event tables this often (interval, default 2 h)
  max_retries         retries before an event is dead-lettered (integer >= 0, default 5)
  dedup_window        how long a dedup key is remembered (interval, 1 s to 7 days, default 5 min)`,
		Args: exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			params, err := parseSets(sets)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := setConfig(ctx, s, args[0], params); err != nil {
				return err
			}
			infos, err := s.queueInfos(ctx, args[0])
			if err != nil {
				return err
			}
			if len(infos) == 0 {
				return fmt.Errorf("queue %q does not exist", args[0])
			}
			c := infos[0].Config
			w, err := s.DedupWindow(ctx, args[0])
			if err != nil {
				return err
			}
			c.DedupWindow = fmtInterval(w)
			if asJSON {
				return a.printJSON(c)
			}
			return table(a.stdout, []string{"PARAMETER", "VALUE"}, [][]string{
				{"ticker_max_count", strconv.Itoa(c.TickerMaxCount)},
				{"ticker_max_lag", c.TickerMaxLag},
				{"ticker_idle_period", c.TickerIdlePeriod},
				{"rotation_period", c.RotationPeriod},
				{"max_retries", strconv.Itoa(c.MaxRetries)},
				{"dedup_window", c.DedupWindow},
			})
		},
	}
	cmd.Flags().StringArrayVar(&sets, "set", nil, "set a parameter first, param=value (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the settings as JSON")
	return cmd
}

// param is one --set param=value.
type param struct{ name, value string }

// parseSets parses --set flags.
func parseSets(sets []string) ([]param, error) {
	out := make([]param, 0, len(sets))
	for _, s := range sets {
		name, value, ok := strings.Cut(s, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || value == "" {
			return nil, usagef("--set %q: want param=value, e.g. --set max_retries=3", s)
		}
		out = append(out, param{name, value})
	}
	return out, nil
}

// setConfig applies params to queue in one transaction.
func setConfig(ctx context.Context, s *session, queue string, params []param) error {
	if len(params) == 0 {
		return nil
	}
	settings := make([]pgque.QueueSetting, len(params))
	for i, p := range params {
		settings[i] = pgque.QueueParam(p.name, p.value)
	}
	return s.SetQueueConfig(ctx, queue, settings...)
}

// nonNil returns s, or an empty slice for nil, so JSON shows [] not null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
