// Command chaosproc runs pgque chaos tests: with no role in the environment
// it is the runner (flags as `pgque chaos`), and the runner re-executes it
// as its worker, producer and ticker processes.
package main

import (
	"os"

	"github.com/pgque/pgque/cmd/pgque/internal/chaos"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "chaos" {
		args = args[1:] // the runner's default re-exec argument
	}
	os.Exit(chaos.Main(args))
}
