// Package migrations embeds the goose SQL migrations so that the binary
// carries its own schema.
package migrations

import "embed"

// FS holds every *.sql migration, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
