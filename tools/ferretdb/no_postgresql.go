//go:build ferretdb_no_postgresql

package main

// withPostgreSQL: the dev stack's build (scripts/toolchain.sh) leaves FerretDB's PostgreSQL backend
// out (its driver is a good part of a cold build); the production profile's build has it.
const withPostgreSQL = false
