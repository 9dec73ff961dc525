package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// send issues a request with headers added one by one, so a test can send
// a header twice (b.do sets each once).
func (b *bundle) send(method, path string, headers ...string) response {
	b.t.Helper()
	req, err := http.NewRequest(method, b.url+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: body}
}

// Finding 8 of issue 8, over HTTP: tokens the JWT library would accept
// get 401 invalid_token saying why.
func TestLenientTokensRefused(t *testing.T) {
	b := setup(t)
	now := time.Now()
	exp, iat := now.Add(time.Hour).Unix(), now.Unix()
	for _, tc := range []struct {
		name, token, reason string
	}{
		{"crit", handMadeToken(testSecret, `{"alg":"HS256","crit":["x-ext"],"x-ext":1}`,
			fmt.Sprintf(`{"sub":"root","role":"admin","iat":%d,"exp":%d}`, iat, exp)), "crit"},
		{"exp as a string", handMadeToken(testSecret, `{"alg":"HS256"}`,
			fmt.Sprintf(`{"sub":"root","role":"admin","iat":%d,"exp":"%d"}`, iat, exp)), "must be a JSON number"},
		// A reader token whose second role claim says admin: the library
		// would let the last one win.
		{"duplicate role", handMadeToken(testSecret, `{"alg":"HS256"}`,
			fmt.Sprintf(`{"sub":"r","role":"reader","role":"admin","iat":%d,"exp":%d}`, iat, exp)), "twice"},
		{"100 years", handMadeToken(testSecret, `{"alg":"HS256"}`,
			fmt.Sprintf(`{"sub":"root","role":"admin","iat":%d,"exp":%d}`, iat, now.AddDate(100, 0, 0).Unix())), "lives longer"},
	} {
		r := b.do("POST", "/v1/audit/list", nil, "Authorization", "Bearer "+tc.token)
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401: %s", tc.name, r.status, r.body)
			continue
		}
		ch := r.header.Get("WWW-Authenticate")
		if !strings.HasPrefix(ch, `Bearer realm="registryd", error="invalid_token"`) || !strings.Contains(ch, tc.reason) {
			t.Errorf("%s: WWW-Authenticate %q does not say %q", tc.name, ch, tc.reason)
		}
	}
}

// Two Authorization headers or two Node-Id headers are 400: the first one
// no longer silently wins.
func TestDuplicateHeadersRefused(t *testing.T) {
	b := setup(t)
	f := b.fixture()
	admin, reader := "Bearer "+tokenFor(t, "root", "admin"), "Bearer "+tokenFor(t, "r", "reader")
	agent := "Bearer " + tokenFor(t, "agent-a", "agent")
	own := fmt.Sprint(f.own)

	for name, values := range map[string][2]string{
		"the same token twice":  {admin, admin},
		"a token, then garbage": {admin, "Bearer x.y.z"},
		"reader, then admin":    {reader, admin},
	} {
		r := b.send("POST", "/v1/audit/list", "Authorization", values[0], "Authorization", values[1])
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "one Authorization header") {
			t.Errorf("two Authorization headers, %s: status %d: %.200s", name, r.status, r.body)
		}
	}
	b.must(http.StatusOK, b.send("POST", "/v1/audit/list", "Authorization", admin))

	if err := b.beats.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	for name, values := range map[string][2]string{
		"the same node twice": {own, own},
		"own, then other":     {own, fmt.Sprint(f.other)},
		"other, then own":     {fmt.Sprint(f.other), own},
		"own, then empty":     {own, ""},
	} {
		r := b.send("GET", "/v1/nodes/ping", "Authorization", agent, "Node-Id", values[0], "Node-Id", values[1])
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "one Node-Id header") {
			t.Errorf("two Node-Id headers, %s: status %d: %.200s", name, r.status, r.body)
		}
	}
	// Node-Id is a pk in plain decimal; other spellings of it are refused.
	for _, v := range []string{"+" + own, "0" + own, own + "x", own + ",7", "0x1", "1e3", "-" + own, "9223372036854775808", "٣"} {
		r := b.send("GET", "/v1/nodes/ping", "Authorization", agent, "Node-Id", v)
		if r.status != http.StatusBadRequest {
			t.Errorf("Node-Id %q: status %d: %s", v, r.status, r.body)
		}
	}
	// None of the refused requests was a heartbeat.
	if err := b.beats.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, _ := b.store.GetNode(context.Background(), f.own); n.LastSeen != nil {
		t.Errorf("a refused request recorded a heartbeat at %v", n.LastSeen)
	}
	// One Node-Id, and an empty one (no node), still work.
	b.must(http.StatusOK, b.send("GET", "/v1/nodes/ping", "Authorization", agent, "Node-Id", own))
	b.must(http.StatusOK, b.send("GET", "/v1/nodes/ping", "Authorization", agent, "Node-Id", ""))
}

// The bearer credentials are one token68: anything else is refused, and a
// scheme other than Bearer gets the plain challenge.
func TestBearerSyntax(t *testing.T) {
	b := setup(t)
	tok := tokenFor(t, "r", "reader")
	b.must(http.StatusOK, b.send("GET", "/v1/nodes/ping", "Authorization", "Bearer "+tok))
	b.must(http.StatusOK, b.send("GET", "/v1/nodes/ping", "Authorization", "bearer   "+tok))
	for _, h := range []string{"Bearer " + tok + " extra", "Bearer " + tok + ",Bearer " + tok, "Bearer " + strings.Replace(tok, ".", "\t.", 1)} {
		r := b.must(http.StatusUnauthorized, b.send("GET", "/v1/nodes/ping", "Authorization", h))
		if !strings.Contains(r.header.Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Errorf("%q: WWW-Authenticate %q", h, r.header.Get("WWW-Authenticate"))
		}
	}
	for _, h := range []string{"Bearer", "Bearer ", "Basic " + tok, "Token " + tok, tok} {
		r := b.must(http.StatusUnauthorized, b.send("GET", "/v1/nodes/ping", "Authorization", h))
		if got := r.header.Get("WWW-Authenticate"); got != `Bearer realm="registryd"` {
			t.Errorf("%q: WWW-Authenticate %q", h, got)
		}
	}
}
