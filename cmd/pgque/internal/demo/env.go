package demo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/internal/install"
	"github.com/pgque/pgque/internal/pgcluster"
)

// clusterTimeout bounds starting and stopping the throwaway cluster.
const clusterTimeout = 2 * time.Minute

// environment is where the demo runs: a database with pgque installed and
// the demo queue created, an admin pool and client (ticker, producers,
// verification), and the throwaway cluster when the demo started one.
type environment struct {
	dsn      string
	cluster  *pgcluster.Cluster
	admin    *pgxpool.Pool
	client   *pgque.Client
	describe string
	progress func(format string, args ...any)
}

// ErrNoPostgres is returned when no DSN was given and no local PostgreSQL
// server binaries were found.
var ErrNoPostgres = errors.New("no local PostgreSQL server binaries found")

// setup starts the cluster when needed, installs pgque and creates the
// demo queue.
func setup(ctx context.Context, o *Options) (env *environment, err error) {
	env = &environment{dsn: o.DSN, progress: func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "demo: "+format+"\n", args...)
	}}
	defer func() {
		if err != nil {
			err = errors.Join(err, env.close(false))
			env = nil
		}
	}()
	if env.dsn == "" {
		if _, err := pgcluster.FindBinDir(); err != nil {
			return env, fmt.Errorf("%w: install them (apt-get install -y postgresql-15) or pass --dsn to run in an existing database (%v)", ErrNoPostgres, err)
		}
		env.progress("starting a throwaway PostgreSQL cluster")
		cctx, cancel := context.WithTimeout(ctx, clusterTimeout)
		defer cancel()
		if env.cluster, err = pgcluster.Start(cctx, pgcluster.Options{}); err != nil {
			return env, fmt.Errorf("starting a throwaway PostgreSQL: %w", err)
		}
		if env.dsn, err = env.cluster.CreateDatabase(cctx, "pgque_demo"); err != nil {
			return env, err
		}
		env.describe = "throwaway cluster (" + env.cluster.BinDir() + ")"
	} else {
		env.describe = "the database given by --dsn"
	}
	if env.admin, err = env.pool(ctx, 12); err != nil {
		return env, err
	}
	res, err := install.Install(ctx, env.admin)
	if err != nil {
		return env, err
	}
	env.progress("pgque %s installed", res.Version)
	if env.client, err = pgque.NewClient(env.admin, &pgque.Config{Logger: o.Logger}); err != nil {
		return env, err
	}
	if err := env.client.DropQueue(ctx, Queue, true); err != nil && !errors.Is(err, pgque.ErrQueueNotFound) {
		return env, err
	}
	if _, err := env.client.CreateQueue(ctx, Queue); err != nil {
		return env, err
	}
	return env, nil
}

// pool opens a pool of at most maxConns connections to the demo database.
func (env *environment) pool(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(env.dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing the DSN: %w", err)
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	return pool, nil
}

// close drops the demo's queue and schema after a passing run in a
// database the user gave (a failed run leaves them for inspection), closes
// the admin pool and removes the throwaway cluster.
func (env *environment) close(passed bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	var errs []error
	if env.admin != nil {
		if env.cluster == nil && passed {
			if err := env.client.DropQueue(ctx, Queue, true); err != nil {
				errs = append(errs, err)
			}
			errs = append(errs, dropSchema(ctx, env.admin))
		} else if env.cluster == nil {
			env.progress("left queue %s and schema %s in the database for inspection", Queue, Schema)
		}
		env.admin.Close()
	}
	if env.cluster != nil {
		env.progress("removing the throwaway cluster")
		errs = append(errs, env.cluster.Stop(ctx))
	}
	return errors.Join(errs...)
}
