// Command ferretdb runs an embedded FerretDB (MongoDB wire protocol) on SQLite, or on PostgreSQL
// (the production profile, scripts/production.ts) when -postgresql-url is given. The dev stack's
// build (.tools/bin/ferretdb) has no PostgreSQL backend; the production profile's
// (.tools/bin/ferretdb-postgresql) has both: see postgresql.go.
//
// Usage: ferretdb -listen 127.0.0.1:27017 -dir /abs/state/dir
//
//	ferretdb -listen 127.0.0.1:27017 -postgresql-url postgres://user@127.0.0.1:5432/ferretdb
//	(the password, if any, in the FERRETDB_POSTGRESQL_PASSWORD environment variable: not on the command line)
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:27017", "TCP address to listen on")
	dir := flag.String("dir", "", "directory for the SQLite state (created if missing)")
	pgURL := flag.String("postgresql-url", "", "use PostgreSQL at this URL instead of SQLite")
	pprofAddr := flag.String("pprof", "", "serve Go's /debug/pprof on this address (off when empty)")
	flag.Parse()
	if *pprofAddr != "" {
		go func() { fmt.Fprintln(os.Stderr, "ferretdb: pprof:", http.ListenAndServe(*pprofAddr, nil)) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *pgURL != "" {
		if !withPostgreSQL {
			fmt.Fprintln(os.Stderr, "ferretdb: this build has no PostgreSQL backend (scripts/toolchain-production.sh builds ferretdb-postgresql, which has)")
			os.Exit(2)
		}
		u, err := url.Parse(*pgURL)
		if err != nil || u.User == nil {
			fmt.Fprintln(os.Stderr, "ferretdb: -postgresql-url must be postgres://user@host:port/db")
			os.Exit(2)
		}
		if pw := os.Getenv("FERRETDB_POSTGRESQL_PASSWORD"); pw != "" {
			u.User = url.UserPassword(u.User.Username(), pw)
		}
		run(ctx, &ferretdb.Config{Listener: ferretdb.ListenerConfig{TCP: *listen}, Handler: "postgresql", PostgreSQLURL: u.String()}, *listen, "PostgreSQL "+u.Redacted())
		return
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "ferretdb: -dir is required")
		os.Exit(2)
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(2)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(2)
	}
	if !strings.HasSuffix(abs, "/") {
		abs += "/"
	}
	run(ctx, &ferretdb.Config{
		Listener: ferretdb.ListenerConfig{TCP: *listen},
		Handler:  "sqlite",
		// Write transactions take SQLite's write lock when they begin (and wait for it up to the
		// busy timeout) instead of failing with SQLITE_BUSY when two writers meet; WAL with
		// synchronous=normal loses nothing on a process crash (only on power loss).
		SQLiteURL: "file:" + abs + "?_txlock=immediate&_pragma=synchronous(normal)",
	}, *listen, abs)
}

// run starts FerretDB with cfg and serves until ctx ends.
func run(ctx context.Context, cfg *ferretdb.Config, listen, state string) {
	f, err := ferretdb.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "ferretdb: listening on %s, state in %s\n", listen, state)
	if err := f.Run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
}
