// Package docs holds the API browser served at /docs: Swagger UI from the
// npm package swagger-ui-dist (pinned in the Makefile and vendored under
// ui/swagger-ui by `make swagger-ui`, so nothing is fetched at build or
// run time) and registryd's own page, initializer and stylesheet. It is
// data only; internal/api serves it.
package docs

import (
	"embed"
	"io/fs"
)

//go:embed ui
var files embed.FS

// FS returns the UI's files: index.html (the page), init.js, docs.css and
// swagger-ui/… (the vendored Swagger UI, with its licences).
func FS() fs.FS {
	sub, err := fs.Sub(files, "ui")
	if err != nil {
		panic("docs: " + err.Error()) // "ui" is a valid path; cannot happen
	}
	return sub
}
