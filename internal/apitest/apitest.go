// Package apitest checks real HTTP traffic against openapi.yaml, so the
// server and its contract cannot drift apart: every response a test
// receives through Client is validated against the spec.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	registryd "github.com/registryd/registryd"
)

var (
	loadOnce sync.Once
	doc      *openapi3.T
	router   routers.Router
	loadErr  error
)

// Spec returns the parsed and validated openapi.yaml.
func Spec(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	d, r, err := load()
	if err != nil {
		t.Fatalf("apitest: openapi.yaml: %v", err)
	}
	return d, r
}

// load parses and validates openapi.yaml once.
func load() (*openapi3.T, routers.Router, error) {
	loadOnce.Do(func() {
		openapi3filter.RegisterBodyDecoder("application/yaml", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
			b, err := io.ReadAll(r)
			return string(b), err
		})
		loader := openapi3.NewLoader()
		doc, loadErr = loader.LoadFromData(registryd.OpenAPI)
		if loadErr != nil {
			return
		}
		if loadErr = doc.Validate(context.Background()); loadErr != nil {
			return
		}
		// Route on path alone: the spec's server URL names the default
		// listen address, while tests listen on random ports.
		doc.Servers = nil
		router, loadErr = gorillamux.NewRouter(doc)
	})
	return doc, router, loadErr
}

// Client returns an HTTP client whose every response is validated against
// the spec; a response the spec does not allow fails the test. Responses to
// paths the spec does not know (deliberate 404 probes) are only checked to
// be problem documents. Every exchange is bounded (30s; the client reads
// whole bodies, so it is not for streams): a server that hangs fails the
// test in seconds, not at the go test timeout.
func Client(t testing.TB) *http.Client {
	t.Helper()
	_, r := Spec(t)
	return &http.Client{Transport: &validator{t: t, router: r, next: http.DefaultTransport}, Timeout: 30 * time.Second}
}

type validator struct {
	t      testing.TB
	router routers.Router
	next   http.RoundTripper
}

func (v *validator) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.GetBody != nil {
		rc, err := req.GetBody()
		if err == nil {
			reqBody, _ = io.ReadAll(rc)
			rc.Close()
		}
	}
	resp, err := v.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if msg := Check(v.router, req, resp.StatusCode, resp.Header, body); msg != "" {
		v.t.Errorf("apitest: %s %s → %d: %s\nbody: %s", req.Method, req.URL.Path, resp.StatusCode, msg, truncate(body))
	}
	// What the server accepted, the spec must accept too: otherwise the
	// spec is stricter than the server and misleads client generators.
	// A body without Content-Type is read as JSON, a leniency OpenAPI
	// cannot express; such requests are not checked.
	if resp.StatusCode < 300 && (len(reqBody) == 0 || req.Header.Get("Content-Type") != "") {
		if msg := CheckRequest(v.router, req, reqBody); msg != "" {
			v.t.Errorf("apitest: %s %s was accepted but the spec refuses it: %s\nrequest body: %s", req.Method, req.URL.Path, msg, truncate(reqBody))
		}
	}
	return resp, nil
}

// CheckRequest validates a request against the spec and returns what is
// wrong, or "".
func CheckRequest(router routers.Router, req *http.Request, body []byte) string {
	route, params, err := router.FindRoute(req)
	if err != nil {
		return err.Error()
	}
	r := req.Clone(context.Background())
	r.Body = io.NopCloser(bytes.NewReader(body))
	// The API reads a header sent empty (Node-Id: , If-Match: ) as one
	// not sent, a leniency OpenAPI cannot express for headers.
	for name, values := range r.Header {
		if len(values) == 1 && values[0] == "" {
			r.Header.Del(name)
		}
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: params,
		Route:      route,
		// Tokens are the server's to judge; the spec check is about shapes.
		Options: &openapi3filter.Options{MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	}
	if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
		return err.Error()
	}
	return ""
}

// Check validates one exchange and returns what is wrong, or "".
func Check(router routers.Router, req *http.Request, status int, header http.Header, body []byte) string {
	if status >= 400 {
		var p struct{ Code string }
		if json.Unmarshal(body, &p) == nil && p.Code != "" {
			codesSeen.Store(p.Code, true)
		}
		if ct := header.Get("Content-Type"); ct != "application/problem+json" {
			return "error response has Content-Type " + ct + ", want application/problem+json"
		}
		for _, leak := range []string{"SQLSTATE", "pgx", "pgconn", "goroutine ", "panic:", "duplicate key"} {
			if bytes.Contains(body, []byte(leak)) {
				return "error response leaks internals (" + leak + ")"
			}
		}
	}
	if header.Get("X-Request-Id") == "" {
		return "response lacks X-Request-Id"
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			return "" // a probe of a path or method the API does not have
		}
		return fmt.Sprintf("the spec has no operation for this request: %v", err)
	}
	// Every operation has a default problem response, for generators'
	// sake; the statuses it serves must still be listed one by one. Only
	// a 405 and a 404 for a path nobody routes are left to the default.
	if route.Operation.Responses.Status(status) == nil && status != http.StatusMethodNotAllowed && status != http.StatusNotFound {
		return fmt.Sprintf("status %d is not listed for %s %s (only its default response covers it)", status, route.Method, route.Path)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request:    req,
			PathParams: params,
			Route:      route,
		},
		Status: status,
		Header: header,
		Body:   io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true, // a status the spec does not list is an error
			MultiError:            true,
		},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return err.Error()
	}
	return ""
}

func truncate(b []byte) string {
	s := string(b)
	if len(s) > 2000 {
		s = s[:2000] + "…"
	}
	return strings.TrimSpace(s)
}

// codesSeen holds the problem codes Check saw (any test of the package).
var codesSeen sync.Map

// DocumentedCodes are the codes openapi.yaml's Problem lists (each
// `code` in its description followed by its status in parentheses).
func DocumentedCodes() ([]string, error) {
	d, _, err := load()
	if err != nil {
		return nil, err
	}
	schema := d.Components.Schemas["Problem"].Value.Properties["code"].Value
	var codes []string
	for _, m := range regexp.MustCompile("`([a-z_]+)` \\(").FindAllStringSubmatch(schema.Description, -1) {
		if !slices.Contains(codes, m[1]) {
			codes = append(codes, m[1])
		}
	}
	return codes, nil
}

// CodesUnseen checks that every documented code was in an answer Check
// saw, when the whole package ran (-run unset): for TestMain, after the
// tests (pgtest.Main's after).
func CodesUnseen(runFlag func() string) func() error {
	return func() error {
		if runFlag() != "" {
			return nil
		}
		codes, err := DocumentedCodes()
		if err != nil {
			return err
		}
		var unseen []string
		for _, c := range codes {
			if _, ok := codesSeen.Load(c); !ok {
				unseen = append(unseen, c)
			}
		}
		if len(unseen) > 0 {
			return fmt.Errorf("apitest: documented problem codes no test got an answer with: %v", unseen)
		}
		return nil
	}
}
