package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) subscribeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "subscribe <queue> <consumer>",
		Short: "Subscribe a consumer to a queue (it starts at the queue's latest tick)",
		Args:  exactArgs("queue", "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			created, err := s.dbq.Subscribe(ctx, args[0], args[1])
			if err != nil {
				return dbErr(fmt.Sprintf("subscribing %q to queue %q", args[1], args[0]), err)
			}
			if created {
				fmt.Fprintf(a.stdout, "subscribed %s to queue %s\n", args[1], args[0])
			} else {
				fmt.Fprintf(a.stdout, "%s was already subscribed to queue %s\n", args[1], args[0])
			}
			return nil
		},
	}
}

func (a *app) unsubscribeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "unsubscribe <queue> <consumer>",
		Short: "Remove a subscription (its pending events are dropped for it)",
		Args:  exactArgs("queue", "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.dbq.Unsubscribe(ctx, args[0], args[1]); err != nil {
				return dbErr(fmt.Sprintf("unsubscribing %q from queue %q", args[1], args[0]), err)
			}
			fmt.Fprintf(a.stdout, "unsubscribed %s from queue %s\n", args[1], args[0])
			return nil
		},
	}
}
