// Package migrations embeds the goose SQL migrations so that the binary
// carries its own schema.
//
// Every migration from 00023 on says which older releases keep serving
// once it is applied, in a line of its Up section:
//
//	-- registryd:compatible-from N
//
// (replicas whose newest migration is N or later), or that none do:
//
//	-- registryd:breaking
//
// An expand step (a new table, a nullable column, an index, a constraint
// NOT VALID, each under a short SET LOCAL lock_timeout) is compatible from the
// migration before it; dropping or renaming what a release still uses is
// not, and waits for a later release. See docs/operating.md, "Upgrades".
package migrations

import "embed"

// FS holds every *.sql migration, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
