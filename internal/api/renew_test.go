package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/api"
	"github.com/registryd/registryd/internal/apitest"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/registry"
)

// withRenewer renews tokens with the server's own verifier, as serve does.
func withRenewer(observed *[]string) option {
	return func(c *api.Config) {
		c.Renewer = &auth.Renewer{Verifier: c.Auth.(*auth.Verifier), Signer: auth.Signer{Secret: testSecret},
			Observe: func(r string) { *observed = append(*observed, r) }}
	}
}

// agentToken mints an agent token bound to ips (none: unbound), 60 % of
// its lifetime over: due for renewal.
func agentToken(t *testing.T, ttl time.Duration, ips ...string) auth.Minted {
	t.Helper()
	m, err := auth.Signer{Secret: testSecret}.Mint(auth.TokenSpec{Sub: "agents-pool", Role: registry.RoleAgent, TTL: ttl, IPs: ips}, time.Now().Add(-ttl*6/10))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type renewed struct {
	Token   string    `json:"token"`
	ID      string    `json:"id"`
	Lineage string    `json:"lineage"`
	Expires time.Time `json:"expires"`
}

func TestRenewToken(t *testing.T) {
	var observed []string
	b := setup(t, withRenewer(&observed))
	first := agentToken(t, 2*time.Hour, "10.1.0.0/24")
	var got renewed
	b.must(http.StatusOK, b.do("POST", "/v1/tokens/renew", nil, "Authorization", "Bearer "+first.Token)).json(t, &got)
	if got.Token == "" || got.Token == first.Token || got.ID == first.ID || got.Lineage != first.ID {
		t.Fatalf("renewal %+v of token %s", got, first.ID)
	}
	if life := time.Until(got.Expires); life < 2*time.Hour-time.Minute || life > 2*time.Hour+time.Second {
		t.Fatalf("the renewal expires in %s, want the first token's 2h", life)
	}
	// The renewal is an agent of the same pool, bound to the same hosts:
	// it registers there, and not elsewhere.
	node := func(ip string) map[string]any {
		return map[string]any{"ip": ip, "index": 0, "cpu_mem": 1 << 30, "driver_version": "550.54.15",
			"hardware_generation": nil, "gpu_mem": nil}
	}
	b.must(http.StatusCreated, b.do("POST", "/v1/nodes/create", node("10.1.0.7"), "Authorization", "Bearer "+got.Token))
	b.must(http.StatusForbidden, b.do("POST", "/v1/nodes/create", node("10.2.0.7"), "Authorization", "Bearer "+got.Token))
	// Not renewed again before half its life is over: a token renews into
	// no copies the moment it is issued. (An empty object is a
	// body too.)
	r := b.must(http.StatusForbidden, b.do("POST", "/v1/tokens/renew", map[string]any{}, "Authorization", "Bearer "+got.Token))
	if !strings.Contains(string(r.body), "half its lifetime") {
		t.Fatalf("%s", r.body)
	}
	if strings.Join(observed, ",") != "renewed,refused" {
		t.Fatalf("observed %v", observed)
	}
}

func TestRenewTokenRefusals(t *testing.T) {
	var observed []string
	b := setup(t, withRenewer(&observed))
	for name, tc := range map[string]struct {
		token  string
		body   any
		status int
		code   string
	}{
		"scheduler":       {tokenFor(t, "sched", registry.RoleScheduler), nil, http.StatusForbidden, registry.CodeNotRenewable},
		"admin":           {tokenFor(t, "root", registry.RoleAdmin), nil, http.StatusForbidden, registry.CodeNotRenewable},
		"unbound agent":   {agentToken(t, time.Hour).Token, nil, http.StatusForbidden, registry.CodeNotRenewable},
		"a body":          {agentToken(t, time.Hour, "10.1.0.1").Token, map[string]any{"ttl": "90d"}, http.StatusBadRequest, registry.CodeInvalid},
		"no token at all": {"", nil, http.StatusUnauthorized, registry.CodeUnauthorized},
	} {
		t.Run(name, func(t *testing.T) {
			hdr := "Bearer " + tc.token
			if tc.token == "" {
				hdr = ""
			}
			r := b.must(tc.status, b.do("POST", "/v1/tokens/renew", tc.body, "Authorization", hdr))
			if code := r.object(t)["code"]; code != tc.code {
				t.Fatalf("code %v, want %s: %s", code, tc.code, r.body)
			}
		})
	}
	// An unbound agent token is refused by the renewer (counted); the other
	// roles never reach it.
	if strings.Join(observed, ",") != "refused" {
		t.Fatalf("observed %v", observed)
	}

	// A replica whose revocation list is stale renews nothing: 503.
	stale := another(t, func(c *api.Config) {
		c.Renewer = &auth.Renewer{Verifier: c.Auth.(*auth.Verifier), Signer: auth.Signer{Secret: testSecret},
			Current: func() error {
				return registry.Errorf(registry.ErrUnavailable, "the token revocation list was last loaded 2m ago")
			}}
	})
	stale.must(http.StatusServiceUnavailable, stale.do("POST", "/v1/tokens/renew", nil, "Authorization", "Bearer "+agentToken(t, time.Hour, "10.1.0.1").Token))

	// A server that signs no tokens refuses every renewal.
	plain := another(t)
	r := plain.must(http.StatusForbidden, plain.do("POST", "/v1/tokens/renew", nil, "Authorization", "Bearer "+agentToken(t, time.Hour, "10.1.0.1").Token))
	if !strings.Contains(string(r.body), "signs no tokens") {
		t.Fatalf("%s", r.body)
	}
}

// A renewal is revoked with the token it renews, on every replica within
// seconds, and a revoked token is not renewed.
func TestRenewedTokensAreRevokedWithTheirLineage(t *testing.T) {
	var observed []string
	b := setup(t)
	one, two := newReplica(b, withRenewer(&observed)), newReplica(b, withRenewer(&observed))
	first := agentToken(t, time.Hour, "10.1.0.1")
	var got renewed
	one.must(http.StatusOK, one.do("POST", "/v1/tokens/renew", nil, "Authorization", "Bearer "+first.Token)).json(t, &got)
	if s, _ := two.status(got.Token); s != http.StatusOK {
		t.Fatalf("the renewal on the other replica: %d", s)
	}
	b.must(http.StatusOK, b.do("POST", "/v1/tokens/revoke", map[string]any{"jti": first.ID}))
	for _, r := range []*replica{one, two} {
		apitest.Eventually(t, 5*time.Second, "the renewal of a revoked token is refused", func() bool {
			s, _ := r.status(got.Token)
			return s == http.StatusUnauthorized
		})
		r.must(http.StatusUnauthorized, r.do("POST", "/v1/tokens/renew", nil, "Authorization", "Bearer "+got.Token))
		r.must(http.StatusUnauthorized, r.do("POST", "/v1/tokens/renew", nil, "Authorization", "Bearer "+first.Token))
	}
}
