package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/registryd/registryd/internal/registry"
)

// etag is the entity tag of a row version. Versions change on every write
// except heartbeats, so a tag names exactly one state of a node.
func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// hardwareTag is the entity tag of a hardware generation. Its body also
// carries the count of nodes using it, which moves without a version bump,
// so the count is part of the tag.
func hardwareTag(h registry.Hardware) string {
	return `"` + strconv.FormatInt(h.Version, 10) + "-" + strconv.FormatInt(h.Nodes, 10) + `"`
}

// matchTag reports whether an If-Match / If-None-Match header value lists
// tag or "*". Strong comparison refuses weak (W/) tags, as RFC 9110 asks of
// If-Match; If-None-Match compares weakly.
func matchTag(header, tag string, strong bool) bool {
	for part := range strings.SplitSeq(header, ",") {
		t := strings.TrimSpace(part)
		if t == "*" {
			return true
		}
		if weak, ok := strings.CutPrefix(t, "W/"); ok {
			if strong {
				continue
			}
			t = weak
		}
		if t == tag {
			return true
		}
	}
	return false
}

// ifMatch turns the request's If-Match header into a check of the current
// tag, run while the row is locked; nil without the header.
func ifMatch(r *http.Request) func(tag string) error {
	h := r.Header.Get("If-Match")
	if h == "" {
		return nil
	}
	return func(tag string) error {
		if matchTag(h, tag, true) {
			return nil
		}
		return registry.Errorf(registry.ErrPrecondition,
			"If-Match %s does not match the current version %s; read it again and retry", h, tag)
	}
}

// notModified answers 304 when If-None-Match already names the tag.
func notModified(w http.ResponseWriter, r *http.Request, tag string) bool {
	w.Header().Set("ETag", tag)
	if h := r.Header.Get("If-None-Match"); h != "" && matchTag(h, tag, false) {
		w.WriteHeader(http.StatusNotModified)
		return true
	}
	return false
}
