package api

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// What a browser page of an allowed origin may send and read. Tokens are
// bearer tokens the page sends itself; no cookie or other credential is
// ever involved, so Access-Control-Allow-Credentials is never sent.
const (
	corsAllowMethods  = "GET, HEAD, POST, PUT, PATCH, DELETE"
	corsAllowHeaders  = "Authorization, Content-Type, Node-Id, If-Match, If-None-Match, Last-Event-ID, X-Request-Id"
	corsExposeHeaders = "ETag, Location, Retry-After, WWW-Authenticate, X-Request-Id, X-Client-Request-Id"
	// corsMaxAge is how long a browser may keep a preflight's answer, in
	// seconds: two hours, the most Chromium honours.
	corsMaxAge = "7200"
)

// CORSAnyOrigin, alone in the list, allows every origin.
const CORSAnyOrigin = "*"

// ParseCORSOrigins reads a comma-separated list of origins allowed to call
// the API from a browser page: each scheme://host[:port] (http or https,
// no path, no wildcard), compared exactly with the Origin a browser sends,
// or "*" alone for any origin. Case and a default port (:443, :80) are
// normalized away, as browsers do; duplicates are dropped. An empty list
// is nil: CORS off.
func ParseCORSOrigins(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	for _, raw := range strings.Split(list, ",") {
		o, err := parseOrigin(strings.TrimSpace(raw))
		if err != nil {
			return nil, err
		}
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	if seen[CORSAnyOrigin] && len(out) > 1 {
		return nil, fmt.Errorf("%q allows every origin; list origins or give %q alone", CORSAnyOrigin, CORSAnyOrigin)
	}
	return out, nil
}

func parseOrigin(s string) (string, error) {
	const want = "want scheme://host[:port] such as https://ops.example.com"
	switch {
	case s == "":
		return "", fmt.Errorf("an empty origin in the list; %s, separated by commas", want)
	case s == CORSAnyOrigin:
		return s, nil
	case strings.Contains(s, "*"):
		return "", fmt.Errorf("%q: wildcards are not supported; list each origin, or give %q alone for any", s, CORSAnyOrigin)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%q: %s", s, want)
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "http" && scheme != "https":
		return "", fmt.Errorf("%q: the scheme must be http or https; %s", s, want)
	case u.Host == "" || u.Opaque != "":
		return "", fmt.Errorf("%q: no host; %s", s, want)
	case u.User != nil:
		return "", fmt.Errorf("%q: an origin has no user name or password; %s", s, want)
	case u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.HasSuffix(s, "#"):
		return "", fmt.Errorf("%q: an origin has no path, query or fragment (not even a trailing /); %s", s, want)
	}
	host := strings.ToLower(u.Host)
	if h, port, err := net.SplitHostPort(host); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("%q: the port must be 1..65535; %s", s, want)
		}
		if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
			host = h
			if strings.Contains(h, ":") {
				host = "[" + h + "]"
			}
		}
	}
	return scheme + "://" + host, nil
}

// cors answers preflights and marks the responses of allowed origins.
type cors struct {
	any     bool
	origins map[string]bool
	s       *Server
}

func newCORS(origins []string, s *Server) *cors {
	c := &cors{origins: map[string]bool{}, s: s}
	for _, o := range origins {
		if o == CORSAnyOrigin {
			c.any = true
		}
		c.origins[o] = true
	}
	return c
}

// handler runs before routing and before any token is looked at: a
// preflight carries no token (browsers never send one with it) and is no
// authenticated request; it only tells the browser what the real request
// may carry, which then meets the same authentication and permission
// checks as any other.
//
// A preflight (OPTIONS with Origin and Access-Control-Request-Method) from
// an allowed origin is answered 204 with what may be sent; from any other
// origin 403, with no CORS headers, so the browser refuses the request.
// Other requests run as ever; those of allowed origins carry
// Access-Control-Allow-Origin and the headers their scripts may read.
// Every response says Vary: Origin, since it depends on it.
func (c *cors) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Add("Vary", "Origin")
		allow := c.allowOrigin(r)
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" && len(r.Header.Values("Origin")) > 0 {
			if allow == "" {
				c.s.writeError(w, r, &httpError{status: http.StatusForbidden,
					detail: "this origin may not call the API from a browser; the server's administrator allows origins with REGISTRY_CORS_ORIGINS"})
				return
			}
			h.Set("Access-Control-Allow-Origin", allow)
			h.Set("Access-Control-Allow-Methods", corsAllowMethods)
			h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
			h.Set("Access-Control-Max-Age", corsMaxAge)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if allow != "" {
			h.Set("Access-Control-Allow-Origin", allow)
			h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
		}
		next.ServeHTTP(w, r)
	})
}

// allowOrigin is the Access-Control-Allow-Origin for r, or "" when its
// origin (exactly one Origin header) is not allowed.
func (c *cors) allowOrigin(r *http.Request) string {
	origins := r.Header.Values("Origin")
	if len(origins) != 1 || origins[0] == "" {
		return ""
	}
	if c.any {
		return CORSAnyOrigin
	}
	if c.origins[origins[0]] {
		return origins[0]
	}
	return ""
}
