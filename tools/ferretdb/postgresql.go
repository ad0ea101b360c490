//go:build !ferretdb_no_postgresql

package main

// withPostgreSQL: this build has FerretDB's PostgreSQL backend (the production profile's build,
// scripts/toolchain-production.sh).
const withPostgreSQL = true
