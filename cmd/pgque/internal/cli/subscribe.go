package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// consumerOf returns the consumer a command names, as --consumer (the
// documented style, shared by every command) or as the positional argument
// after the queue (accepted so that scripts written for it keep working).
func consumerOf(flag string, args []string) (string, error) {
	positional := ""
	if len(args) > 1 {
		positional = args[1]
	}
	switch {
	case flag != "" && positional != "" && flag != positional:
		return "", usagef("the consumer is given twice, as --consumer %q and as argument %q: give it once, as --consumer", flag, positional)
	case flag != "":
		return flag, nil
	case positional != "":
		return positional, nil
	}
	return "", usagef("--consumer is required")
}

func (a *app) subscribeCommand() *cobra.Command {
	var consumer string
	cmd := &cobra.Command{
		Use:   "subscribe <queue> --consumer c",
		Short: "Subscribe a consumer to a queue (it starts at the queue's latest tick)",
		Long: `Subscribe subscribes a plain consumer. It receives the events sent after
the subscription exists, not those sent before: subscribe when you install,
before the producers start. ('pgque subscribe <queue> <consumer>' is accepted
too.)`,
		Args: rangeArgs([]string{"queue"}, "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			consumer, err := consumerOf(consumer, args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			created, err := s.Subscribe(ctx, args[0], consumer)
			if err != nil {
				return err
			}
			if created {
				fmt.Fprintf(a.stdout, "subscribed %s to queue %s\n", consumer, args[0])
			} else {
				fmt.Fprintf(a.stdout, "%s was already subscribed to queue %s\n", consumer, args[0])
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	return cmd
}

func (a *app) unsubscribeCommand() *cobra.Command {
	var consumer string
	cmd := &cobra.Command{
		Use:   "unsubscribe <queue> --consumer c",
		Short: "Remove a subscription (its pending events are dropped for it)",
		Args:  rangeArgs([]string{"queue"}, "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			consumer, err := consumerOf(consumer, args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if _, err := s.Unsubscribe(ctx, args[0], consumer); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "unsubscribed %s from queue %s\n", consumer, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	return cmd
}
