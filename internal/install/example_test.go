package install_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
	sqlfiles "github.com/pgque/pgque/sql"
)

// Install, upgrade in place, then uninstall, on a throwaway cluster.
func Example() {
	ctx := context.Background()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Stop(ctx)
	dsn, err := cluster.CreateDatabase(ctx, "app")
	if err != nil {
		fmt.Println(err)
		return
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close(ctx)

	for range 2 {
		res, err := install.Install(ctx, conn)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("fresh=%v current=%v\n", res.Fresh(), res.Version == sqlfiles.Version)
	}
	if err := install.Uninstall(ctx, conn, true); err != nil {
		fmt.Println(err)
		return
	}
	v, err := install.InstalledVersion(ctx, conn)
	fmt.Printf("after uninstall: %q %v\n", v, err)
	// Output:
	// fresh=true current=true
	// fresh=false current=true
	// after uninstall: "" <nil>
}
