package api_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// refused checks that r is a 400 naming exactly fields, without stopping
// the test, so one run reports every case that fails.
func refused(t *testing.T, what string, r response, fields ...string) {
	t.Helper()
	if r.status != http.StatusBadRequest {
		t.Errorf("%s: status %d, want 400; body: %.300s", what, r.status, r.body)
		return
	}
	if got := r.problemFields(t); !slices.Equal(got, fields) {
		t.Errorf("%s: fields %v, want %v", what, got, fields)
	}
}

// doWatch opens a watch that the server is expected to refuse; a stream it
// accepts instead is cut off after its headers, never read to the end.
func (b *bundle) doWatch(query string) response {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url+"/v1/nodes/watch"+query, nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return response{status: resp.StatusCode, header: resp.Header}
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: body.Bytes()}
}

// list, claim and watch share one filter with one validation: values no
// node can have are a 400 everywhere, never an empty answer.
func TestFiltersValidatedAlike(t *testing.T) {
	b := setup(t)
	b.createNode(nil)
	for _, tc := range []struct{ body, field string }{
		{`{"current_job": -1}`, "current_job"},
		{`{"current_job": 0}`, "current_job"},
		{`{"hardware_generation": -1}`, "hardware_generation"},
		{`{"hardware_generation": 0}`, "hardware_generation"},
		{`{"index": 2147483648}`, "index"},
		{`{"source": "bogus"}`, "source"},
		{`{"seen_within": 3153600001}`, "seen_within"},
		{`{"seen_within": 9223372036854775807}`, "seen_within"},
		{`{"seen_within": -9223372036854775808}`, "seen_within"},
	} {
		refused(t, "list "+tc.body, b.do("POST", "/v1/nodes/list", tc.body), tc.field)
		if tc.field == "current_job" {
			continue // not a claim filter at all
		}
		claim := `{"job": 7,` + tc.body[1:]
		refused(t, "claim "+claim, b.do("POST", "/v1/nodes/claim", claim), tc.field)
	}
	// A claim naming current_job is told once, whatever its value.
	refused(t, "claim current_job", b.do("POST", "/v1/nodes/claim", `{"job": 7, "current_job": -1}`), "current_job")
	// Wire errors and range errors come in one answer.
	refused(t, "list", b.do("POST", "/v1/nodes/list", `{"bogus": 1, "hardware_generation": -1}`), "hardware_generation", "bogus")

	for _, tc := range []struct{ query, field string }{
		{"?source=bogus", "source"},
		{"?index=-1", "index"},
		{"?index=2147483648", "index"},
		{"?index=99999999999999999999", "index"},
		{"?hardware_generation=0", "hardware_generation"},
		{"?hardware_generation=-3", "hardware_generation"},
		{"?node=0", "node"},
		{"?node=x", "node"},
		{"?ip=nope", "ip"},
		{"?source=api&source=scp", "source"},
		{"?colour=red", "colour"},
	} {
		refused(t, "watch "+tc.query, b.doWatch(tc.query), tc.field)
	}

	for _, tc := range []struct{ body, field string }{
		{`{"target_pk": 0}`, "target_pk"},
		{`{"target_pk": -5}`, "target_pk"},
		{`{"target_type": "job"}`, "target_type"},
		{`{"principal": "a\u0000b"}`, "principal"},
		{`{"after": -1}`, "after"},
		{`{"limit": 0}`, "limit"},
		{`{"action": "node.explode"}`, "action"},
		{`{"action": ["node.create"]}`, "action"},
		{`{"action": null}`, "action"},
		{`{"role": "root"}`, "role"},
		{`{"role": 1}`, "role"},
	} {
		refused(t, "audit "+tc.body, b.do("POST", "/v1/audit/list", tc.body), tc.field)
	}
	refused(t, "audit", b.do("POST", "/v1/audit/list", `{"bogus": 1, "target_pk": 0}`), "target_pk", "bogus")
	refused(t, "audit", b.do("POST", "/v1/audit/list", `{"action": "node.nuke", "role": "god"}`), "action", "role")
}

// The watch filters select events exactly as list selects nodes.
func TestWatchFiltersMatchList(t *testing.T) {
	b := setup(t)
	hw := b.createHardware("H100")
	w := watchStream(t, b.url, fmt.Sprintf("?source=api&index=1&hardware_generation=%d", hw), b.token)
	b.createNode(map[string]any{"ip": "10.0.0.1", "index": 0, "hardware_generation": hw})
	b.createNode(map[string]any{"ip": "10.0.0.2", "index": 1})
	want := b.createNode(map[string]any{"ip": "10.0.0.3", "index": 1, "hardware_generation": hw})
	if e := w.next(); e.nodePK() != want {
		t.Errorf("watch got node %d, want %d", e.nodePK(), want)
	}
	var listed []struct{ PK int64 }
	b.must(http.StatusOK, b.do("POST", "/v1/nodes/list", map[string]any{"source": "api", "index": 1, "hardware_generation": hw})).json(t, &listed)
	if len(listed) != 1 || listed[0].PK != want {
		t.Errorf("list: %v", listed)
	}
	one := watchStream(t, b.url, fmt.Sprintf("?node=%d", want), b.token)
	b.must(http.StatusOK, b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", want-1), map[string]any{"cpu_mem": 5}))
	b.must(http.StatusOK, b.do("PATCH", fmt.Sprintf("/v1/nodes/%d", want), map[string]any{"cpu_mem": 5}))
	if e := one.next(); e.nodePK() != want || e.Type != "updated" {
		t.Errorf("node watch: %+v", e)
	}
}
