// Command importcheck uses the pgque library the way a service would.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/pgquemigrate"
)

func main() {
	client, err := pgque.Connect(context.Background(), os.Getenv("DATABASE_URL"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer client.Close()
	fmt.Println("pgque schema", pgque.SchemaVersion, pgquemigrate.Version)
}
