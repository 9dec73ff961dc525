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
	if _, err := readWatchFilter(r.URL.Query()); err != nil {
		return err
	}
	if _, err := resumeFrom(r); err != nil {
		return err
	}
	if s.events == nil {
		return &httpError{status: http.StatusServiceUnavailable, detail: "watching is not enabled on this server"}
	}
	if err := s.events.Admit(principalFrom(r.Context()).Sub); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return nil
}
