package cli

import (
	"context"
	"testing"
)

// TestChaosCommandIsWired: `pgque chaos` hands its flags to the chaos
// runner untouched and returns the runner's exit code (the runs themselves
// are tested in internal/chaos).
func TestChaosCommandIsWired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if r := execIn(ctx, nil, "", "chaos", "-help"); r.code != ExitOK {
		t.Errorf("pgque chaos -help: %v", r)
	}
	if r := execIn(ctx, nil, "", "chaos", "-duration", "soon"); r.code != ExitUsage {
		t.Errorf("pgque chaos -duration soon: %v; want exit %d", r, ExitUsage)
	}
}
