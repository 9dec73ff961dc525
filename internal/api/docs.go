package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"time"

	"github.com/go-chi/chi/v5"
)

// DocsCSP is the Content-Security-Policy of every /docs response. The page
// runs Swagger UI from this origin and nothing else: scripts and styles
// only from files served here (no inline script or style, no eval),
// images from here or data: URIs (Swagger UI's stylesheet draws its icons
// with them), connections (the spec, "Try it out") to this origin only,
// no fonts, frames, objects, workers or manifests, never framed itself, no
// <base> and no form submissions.
const DocsCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// docsFile is one file of the API browser, ready to serve.
type docsFile struct {
	body        []byte
	etag        string
	contentType string
}

// docsPage is the file served at /docs itself.
const docsPage = "index.html"

// loadDocs reads every regular file of fsys once, with its ETag (a hash of
// the content) and Content-Type. A nil fsys serves nothing.
func loadDocs(fsys fs.FS) (map[string]docsFile, error) {
	files := map[string]docsFile{}
	if fsys == nil {
		return files, nil
	}
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		files[name] = docsFile{body: body, etag: `"` + hex.EncodeToString(sum[:16]) + `"`, contentType: docsContentType(name)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, ok := files[docsPage]; !ok {
		return nil, errors.New("api: the docs files have no " + docsPage)
	}
	return files, nil
}

// docsContentType is set explicitly rather than looked up in the system's
// MIME tables, which differ between machines.
func docsContentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".png":
		return "image/png"
	case ".txt", "":
		return "text/plain; charset=utf-8" // LICENSE, NOTICE, VERSION, SHA256SUMS
	default:
		return "application/octet-stream"
	}
}

// docsHeaders puts the browser's protections on every /docs response,
// errors included.
func docsHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", DocsCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY") // for browsers without frame-ancestors
		h.Set("Referrer-Policy", "no-referrer")
		next.ServeHTTP(w, r)
	})
}

// routeDocs adds the API browser: GET and HEAD /docs (the page) and
// /docs/{file} (what it loads). Like /openapi.yaml it needs no token: it
// holds nothing but the public contract's viewer, and every request it
// sends carries the token the user enters.
func (s *Server) routeDocs(r chi.Router) {
	r.Group(func(r chi.Router) {
		r.Use(docsHeaders)
		getAndHead(r, "/docs", s.handle(s.serveDocsPage))
		getAndHead(r, "/docs/*", s.handle(s.serveDocsFile))
	})
}

func (s *Server) serveDocsPage(w http.ResponseWriter, r *http.Request) error {
	return s.serveDocs(w, r, docsPage)
}

func (s *Server) serveDocsFile(w http.ResponseWriter, r *http.Request) error {
	name := chi.URLParam(r, "*")
	if name == "" {
		// /docs/: the page's relative URLs would resolve under /docs/docs/.
		// Relative, so that a proxy's path prefix is kept.
		w.Header().Set("Location", "../docs")
		w.WriteHeader(http.StatusMovedPermanently)
		return nil
	}
	if name == docsPage {
		return &httpError{status: http.StatusNotFound, detail: "no such file; the API browser is at /docs"}
	}
	return s.serveDocs(w, r, name)
}

// serveDocs serves one file with its ETag; browsers revalidate (no-cache)
// and get 304 while it is unchanged. HEAD, Range and the conditional
// headers are http.ServeContent's.
func (s *Server) serveDocs(w http.ResponseWriter, r *http.Request, name string) error {
	f, ok := s.docs[name]
	if !ok {
		if name == docsPage {
			return &httpError{status: http.StatusNotFound, detail: "this server was built without the API browser"}
		}
		return &httpError{status: http.StatusNotFound, detail: "no such file; the API browser is at /docs"}
	}
	h := w.Header()
	h.Set("Content-Type", f.contentType)
	h.Set("ETag", f.etag)
	h.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
	return nil
}
