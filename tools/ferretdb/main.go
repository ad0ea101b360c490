// Command ferretdb runs an embedded FerretDB (MongoDB wire protocol) on SQLite.
//
// Usage: ferretdb -listen 127.0.0.1:27017 -dir /abs/state/dir
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	_ "net/http/pprof"
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
	pprofAddr := flag.String("pprof", "", "serve Go's /debug/pprof on this address (off when empty)")
	flag.Parse()
	if *pprofAddr != "" {
		go func() { fmt.Fprintln(os.Stderr, "ferretdb: pprof:", http.ListenAndServe(*pprofAddr, nil)) }()
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
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: *listen},
		Handler:   "sqlite",
		// Write transactions take SQLite's write lock when they begin (and wait for it up to the
		// busy timeout) instead of failing with SQLITE_BUSY when two writers meet; WAL with
		// synchronous=normal loses nothing on a process crash (only on power loss).
		SQLiteURL: "file:" + abs + "?_txlock=immediate&_pragma=synchronous(normal)",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "ferretdb: listening on %s, state in %s\n", *listen, abs)
	if err := f.Run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
}
