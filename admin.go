package pgque

import (
	"context"
	"fmt"
)

// CreateQueue creates a queue and reports whether it was created (false: it
// already existed). Requires the pgque_admin role.
func (c *Client) CreateQueue(ctx context.Context, queue string) (bool, error) {
	created, err := c.queries.CreateQueue(ctx, queue)
	return created, mapError(fmt.Sprintf("creating queue %q", queue), err)
}

// DropQueue drops a queue; force drops it even while it has subscriptions.
// Requires the pgque_admin role.
func (c *Client) DropQueue(ctx context.Context, queue string, force bool) error {
	return mapError(fmt.Sprintf("dropping queue %q", queue), c.queries.DropQueue(ctx, queue, force))
}
