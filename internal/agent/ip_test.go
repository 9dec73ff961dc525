package agent

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestRouteIP(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for server, want := range map[string]string{
		"http://127.0.0.1:8080":          "127.0.0.1",
		"https://127.0.0.1":              "127.0.0.1",
		"http://localhost:1":             "", // either loopback, as the resolver answers
		"http://[::ffff:127.0.0.1]:8080": "127.0.0.1",
	} {
		u, _ := url.Parse(server)
		got, err := RouteIP(ctx, u)
		if err != nil {
			t.Errorf("%s: %v", server, err)
			continue
		}
		if want != "" && got != want || want == "" && got != "127.0.0.1" && got != "::1" {
			t.Errorf("%s: %s, want %s", server, got, want)
		}
	}
	u, _ := url.Parse("http://no-such-host.invalid:8080")
	if _, err := RouteIP(ctx, u); err == nil || !strings.Contains(err.Error(), "no-such-host.invalid") {
		t.Errorf("unresolvable host: %v", err)
	}
}
