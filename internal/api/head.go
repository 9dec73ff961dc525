package api

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// getAndHead routes GET and HEAD of pattern to h. HEAD runs the GET handler
// whole, so status and headers (ETag, Content-Type, 304, 401, 403) are the
// same; net/http sends no body for HEAD.
func getAndHead(r chi.Router, pattern string, h http.HandlerFunc) {
	r.Get(pattern, h)
	r.Head(pattern, h)
}

// headWatch is HEAD /v1/nodes/watch: the checks GET makes before its
// stream starts (the caps on streams included), then the stream's
// headers, and the answer ends. It never subscribes, so it cannot hang
// and holds no slot.
func (s *Server) headWatch(w http.ResponseWriter, r *http.Request) error {
	if _, _, err := s.checkWatch(r); err != nil {
		return err
	}
	if err := s.events.Admit(principalFrom(r.Context()).Sub); err != nil {
		return err
	}
	setStreamHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	return nil
}
