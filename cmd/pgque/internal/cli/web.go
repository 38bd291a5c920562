package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/httpbound"
	"github.com/pgque/pgque/cmd/pgque/internal/web"
)

// Settings of pgque web.
const (
	// WebListenDefault is where the console listens: loopback only.
	WebListenDefault = "127.0.0.1:8642"
	// EnvWebToken, when set, is the action token (else one is generated and
	// printed once).
	EnvWebToken = "PGQUE_WEB_TOKEN"
)

func (a *app) webCommand() *cobra.Command {
	var (
		listen       string
		allowActions bool
		hosts        []string
		sample       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "web [--listen 127.0.0.1:8642] [--allow-actions]",
		Short: "Serve the web console: queues, consumers and slots, keys, dead letters",
		Long: `Web serves an operator console on --listen (loopback only by default): queues
with their rate, backlog, ticker lag and rotation; partitioned consumers and
their slots (owner, epoch, lag, head age); the keys of a consumer (oldest
pending heads, blocked keys, hottest keys); dead letters (list, inspect
payload). Pages refresh themselves and chart the last minutes. Everything is
embedded in the binary: the console works offline and loads nothing from
elsewhere.

The console is read-only unless --allow-actions is given. Then a key can be
unblocked or retried now and dead letters replayed or purged, each request
carrying the token in a header: $` + EnvWebToken + ` (at least 16 characters;
a shorter one is refused), or a random token printed once at start. The
database role of --dsn bounds what any action can do: run the console as a
pgque_reader role to make actions impossible.

Every read of the database, as every action, needs the token ($` + EnvWebToken + `,
or a random one printed at start): open the address printed at start, or
/#token=<token>, once in the browser tab (the page keeps it in the tab's
session storage, which no other port or site can read, and sends it in the
X-Pgque-Token header; no cookie is set), or send that header yourself. On
loopback too: any local user can reach a loopback port, and the console
reads with the role of --dsn. On a loopback
address (the default) the console also answers only to the Host names
localhost, 127.0.0.1 and ::1 (or those of --allowed-host), so that a web page
cannot reach it by DNS rebinding.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return usagef("--listen %q: %v", listen, err)
			}
			ctx := cmd.Context()
			s, err := a.connectWith(ctx, &pgque.Config{Logger: a.logger(slog.LevelWarn), PollOnly: true})
			if err != nil {
				return err
			}
			defer s.Close()
			cfg, generated := webAccess(host, allowActions, hosts, os.Getenv(EnvWebToken))
			if len(cfg.Token) < web.MinTokenLength && cfg.Token != "" {
				return usagef("$%s is %d characters long: the console needs a token of at least %d characters",
					EnvWebToken, len(cfg.Token), web.MinTokenLength)
			}
			if generated {
				fmt.Fprintf(a.stderr, "pgque web: token (send it in the %s header): %s\n", web.TokenHeader, cfg.Token)
			}
			cfg.Client, cfg.Logger, cfg.SampleInterval = s.Client, a.logger(slog.LevelInfo), sample
			srv, err := web.New(cfg)
			if err != nil {
				return usagef("%v", err)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", listen, err)
			}
			mode := "read-only"
			if allowActions {
				mode = "actions enabled"
			}
			fmt.Fprintf(a.stdout, "pgque web: serving http://%s (%s)\n", ln.Addr(), mode)
			if generated {
				fmt.Fprintf(a.stderr, "pgque web: every read needs the token; open http://%s/#%s=%s once in the browser tab\n",
					ln.Addr(), web.TokenParam, cfg.Token)
			} else {
				fmt.Fprintf(a.stderr, "pgque web: every read needs the token; open http://%s/#%s=<$%s> once in the browser tab\n",
					ln.Addr(), web.TokenParam, EnvWebToken)
			}
			return serveWeb(ctx, ln, srv)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", WebListenDefault, "address to listen on (host:port; port 0 picks a free one)")
	cmd.Flags().BoolVar(&allowActions, "allow-actions", false, "allow unblock, retry now, replay and purge (behind a token)")
	cmd.Flags().StringSliceVar(&hosts, "allowed-host", nil,
		"Host header values the console answers to (default: loopback names when listening on loopback, any otherwise, with the token required)")
	cmd.Flags().DurationVar(&sample, "sample", web.SampleIntervalDefault, "how often the charts are sampled")
	return cmd
}

// webAccess is who may reach a console listening on host: every request
// needs the token, on loopback too, since any local user can reach a
// loopback port and the console reads with its own database role (dead
// letters, payloads and keys of every queue that role may read); a
// loopback address also answers only to loopback Host names (unless hosts
// says otherwise). The token is envToken, or a random one (generated
// true).
func webAccess(host string, allowActions bool, hosts []string, envToken string) (cfg web.Config, generated bool) {
	cfg.AllowActions, cfg.RequireToken = allowActions, true
	cfg.AllowedHosts = hosts
	if len(hosts) == 0 {
		cfg.AllowedHosts = defaultWebHosts(host)
	}
	cfg.Token = envToken
	if cfg.Token == "" {
		cfg.Token, generated = randomHex(16), true
	}
	return cfg, generated
}

// defaultWebHosts: on a loopback address the console answers only to
// loopback names, so that a web page cannot reach it through DNS
// rebinding; elsewhere the operator chose the exposure.
func defaultWebHosts(host string) []string {
	ip := net.ParseIP(host)
	if host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return []string{"127.0.0.1", "localhost", "::1", host}
	}
	return nil
}

// serveWeb serves until ctx ends, then shuts the server down.
func serveWeb(ctx context.Context, ln net.Listener, srv *web.Server) error {
	hs := httpbound.Server(srv)
	ln = httpbound.Listener(ln, httpbound.MaxConns)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() { defer close(sampled); srv.Run(sampleCtx) }()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
		shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = hs.Shutdown(shutCtx)
		cancel()
		<-served
	case err = <-served:
	}
	stopSampling()
	<-sampled
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
