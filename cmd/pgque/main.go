// Command pgque is the command line for pgque: install, run the ticker,
// administer queues and subscriptions, send, tail, watch status, handle dead
// letters, run the demo and the benchmarks. See internal/cli.
package main

import (
	"os"

	"github.com/pgque/pgque/cmd/pgque/internal/cli"
)

func main() {
	os.Exit(cli.Main())
}
