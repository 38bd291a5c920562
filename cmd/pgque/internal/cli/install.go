package cli

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque/pgquemigrate"
)

// Version is the binary's version. Release builds set it with
// -ldflags "-X github.com/pgque/pgque/cmd/pgque/internal/cli.Version=v1.2.3"; otherwise
// it is read from the module's build information.
var Version = ""

// binaryVersion returns Version, else the main module's version and VCS
// revision from the build information, else "devel".
func binaryVersion() string {
	if Version != "" {
		return Version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

func (a *app) installCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Install pgque into the database (idempotent: re-running upgrades in place)",
		Long: `Install applies pgque's SQL (schema pgque, roles pgque_reader, pgque_writer and
pgque_admin) in one transaction. It needs a role that may create a schema in
the database and create roles (or finds them created); no superuser.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runInstall(cmd.Context(), asJSON, false)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func (a *app) upgradeCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade pgque in place to this binary's schema version (same as install)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runInstall(cmd.Context(), asJSON, true)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// runInstall installs or upgrades and reports the versions.
func (a *app) runInstall(ctx context.Context, asJSON, upgrade bool) error {
	pool, err := a.openPool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := pgquemigrate.Install(ctx, pool)
	if err != nil {
		return err
	}
	if len(res.RoleAdmins) > 0 {
		fmt.Fprintf(a.stderr, "pgque install: warning: these roles may grant pgque's roles to any role (ADMIN OPTION; "+
			"on PostgreSQL 16+ a CREATEROLE role has it on the roles it created): %s; "+
			"make sure each is one you trust, or have a superuser revoke it (docs/security.md)\n",
			strings.Join(res.RoleAdmins, ", "))
	}
	if asJSON {
		return a.printJSON(map[string]any{"previous": res.Previous, "version": res.Version, "fresh": res.Fresh(),
			"role_admins": append([]string{}, res.RoleAdmins...)})
	}
	switch {
	case res.Fresh():
		fmt.Fprintf(a.stdout, "installed pgque %s\n", res.Version)
	case upgrade && res.Previous != res.Version:
		fmt.Fprintf(a.stdout, "upgraded pgque %s → %s\n", res.Previous, res.Version)
	case upgrade:
		fmt.Fprintf(a.stdout, "pgque %s → %s (already current; SQL re-applied)\n", res.Previous, res.Version)
	default:
		fmt.Fprintf(a.stdout, "pgque %s → %s (SQL re-applied in place)\n", res.Previous, res.Version)
	}
	return nil
}

func (a *app) uninstallCommand() *cobra.Command {
	var dropRoles, yes bool
	cmd := &cobra.Command{
		Use:   "uninstall --yes",
		Short: "Drop schema pgque with every queue, event and subscription in it",
		Long: `Uninstall drops schema pgque and everything in it: every queue, event,
subscription and dead letter. With --drop-roles it also drops the pgque_*
roles that nothing else uses any more. It asks for --yes.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !yes {
				return usagef("uninstall drops every queue and event in schema pgque; pass --yes to confirm")
			}
			pool, err := a.openPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			prev, err := pgquemigrate.InstalledVersion(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if err := pgquemigrate.Uninstall(cmd.Context(), pool, dropRoles); err != nil {
				return err
			}
			switch {
			case prev == "":
				fmt.Fprintln(a.stdout, "pgque was not installed; nothing to drop")
			case dropRoles:
				fmt.Fprintf(a.stdout, "uninstalled pgque %s (schema and unused roles dropped)\n", prev)
			default:
				fmt.Fprintf(a.stdout, "uninstalled pgque %s (roles kept)\n", prev)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&dropRoles, "drop-roles", false, "also drop the pgque_reader, pgque_writer and pgque_admin roles when unused")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm")
	return cmd
}

func (a *app) sqlCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "sql",
		Short: "Print the install script, for psql -1 -f",
		Long: `Sql prints the whole install script, to apply with psql where the pgque
binary cannot connect:

  pgque sql > pgque.sql && psql -1 -f pgque.sql "$DATABASE_URL"`,
		Args: exactArgs(),
		RunE: func(*cobra.Command, []string) error {
			script, err := pgquemigrate.Script()
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(a.stdout, script)
			return err
		},
	}
}

func (a *app) versionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the binary's version, and the installed schema version when a database is given",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := map[string]any{"binary": binaryVersion(), "schema": pgquemigrate.Version}
			if !asJSON {
				fmt.Fprintf(a.stdout, "pgque %s (schema %s)\n", binaryVersion(), pgquemigrate.Version)
			}
			if dsn, _ := a.resolveDSN(); dsn != "" {
				pool, err := a.openPool(cmd.Context())
				if err != nil {
					return err
				}
				defer pool.Close()
				installed, err := pgquemigrate.InstalledVersion(cmd.Context(), pool)
				if err != nil {
					return err
				}
				out["installed"] = installed
				if !asJSON {
					if installed == "" {
						installed = "none (run 'pgque install')"
					}
					fmt.Fprintf(a.stdout, "installed: %s\n", installed)
				}
			}
			if asJSON {
				return a.printJSON(out)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the versions as JSON")
	return cmd
}
