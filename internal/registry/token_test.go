package registry

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseIPSet(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string // FormatIPSet of the result, or "error: <piece of it>"
	}{
		{[]string{"10.0.0.7"}, "10.0.0.7"},
		{[]string{"10.0.0.0/24", "2001:DB8::/32"}, "10.0.0.0/24, 2001:db8::/32"},
		{[]string{"::ffff:10.0.0.7"}, "10.0.0.7"},
		{[]string{"::ffff:10.0.0.0/120"}, "10.0.0.0/24"},
		{[]string{"::ffff:0:0/96"}, "0.0.0.0/0"},
		{[]string{"10.0.0.7/32"}, "10.0.0.7"},
		{[]string{"0.0.0.0/0", "::/0"}, "0.0.0.0/0, ::/0"},
		{nil, "error: at least one"},
		{[]string{}, "error: at least one"},
		{[]string{"10.0.0.7/24"}, "error: write 10.0.0.0/24"},
		{[]string{"10.0.0.256"}, "error: not an IP address"},
		{[]string{"10.0.0.0/33"}, "error: not an IP address"},
		{[]string{"fe80::1%eth0"}, "error: zone"},
		{[]string{"fe80::%eth0/64"}, "error: zone"},
		{[]string{" 10.0.0.7"}, "error: not an IP address"},
		{[]string{"host.example"}, "error: not an IP address"},
		{[]string{"\x00\x01"}, "error: (unprintable)"},
		{make([]string, MaxTokenIPs+1), "error: at most"},
	} {
		got, err := ParseIPSet(tc.in)
		s := FormatIPSet(got)
		if err != nil {
			s = "error: " + err.Error()
		}
		if !strings.HasPrefix(tc.want, "error: ") && s != tc.want || strings.HasPrefix(tc.want, "error: ") && !strings.Contains(s, strings.TrimPrefix(tc.want, "error: ")) {
			t.Errorf("ParseIPSet(%q) = %s, want %s", tc.in, s, tc.want)
		}
	}
}

func TestMayUseIP(t *testing.T) {
	set, err := ParseIPSet([]string{"10.0.0.7", "10.1.0.0/24", "2001:db8::/64"})
	if err != nil {
		t.Fatal(err)
	}
	bound := Principal{Sub: "a", Role: RoleAgent, IPs: set}
	for ip, want := range map[string]bool{
		"10.0.0.7": true, "10.0.0.8": false, "::ffff:10.0.0.7": true, "::ffff:a00:7": true,
		"10.1.0.0": true, "10.1.0.255": true, "10.1.1.0": false, "10.0.255.255": false,
		"2001:db8::": true, "2001:db8::ffff:ffff:ffff:ffff": true, "2001:db8:0:1::": false,
		"::10.0.0.7": false, "2001:db8::1%eth0": false, "": false, "garbage": false,
	} {
		if got := bound.MayUseIP(ip); got != want {
			t.Errorf("bound MayUseIP(%q) = %v, want %v", ip, got, want)
		}
	}
	if !(Principal{Sub: "a", Role: RoleAgent}).MayUseIP("192.0.2.1") {
		t.Error("an unbound principal may not use an address")
	}
}

func TestRevocationSet(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	s := NewRevocationSet([]Revocation{
		{Sub: "leaked", Before: t0},
		{Sub: "twice", Before: t0.Add(-time.Hour)},
		{Sub: "twice", Before: t0}, // the later instant wins
		{Sub: "twice", Before: t0.Add(-2 * time.Hour)},
		{JTI: "tok-1"},
	})
	for _, tc := range []struct {
		sub, jti string
		iat      *time.Time
		want     bool
	}{
		{"leaked", "", at(-time.Second), true},
		{"leaked", "", at(0), false}, // issued at the instant: accepted
		{"leaked", "", at(time.Second), false},
		{"leaked", "", nil, true}, // issue time unknown
		{"twice", "", at(-time.Minute), true},
		{"twice", "", at(0), false},
		{"other", "", nil, false},
		{"other", "tok-1", at(time.Hour), true},
		{"other", "tok-2", nil, false},
		{"leaked", "tok-2", at(time.Second), false},
	} {
		if got := s.Revokes(tc.sub, tc.jti, tc.iat); got != tc.want {
			t.Errorf("Revokes(%q, %q, %v) = %v, want %v", tc.sub, tc.jti, tc.iat, got, tc.want)
		}
	}
	if s.Len() != 3 {
		t.Errorf("Len = %d", s.Len())
	}
}

func TestRevocationNormalize(t *testing.T) {
	now := time.Now()
	u, past := now.Add(time.Hour), now.Add(-time.Second)
	for _, tc := range []struct {
		r    Revocation
		want string // the fields at fault
	}{
		{Revocation{Sub: "agent-1"}, ""},
		{Revocation{JTI: "abc"}, ""},
		{Revocation{JTI: "abc", Until: &u}, ""},
		{Revocation{JTI: "abc", Until: &now}, ""},
		{Revocation{JTI: "abc", Until: &past}, "[until]"},
		{Revocation{}, "[sub]"},
		{Revocation{Sub: "a", JTI: "b"}, "[jti]"},
		{Revocation{Sub: "a", Until: &u}, "[until]"},
		{Revocation{Sub: "a\x00"}, "[sub]"},
		{Revocation{JTI: strings.Repeat("x", MaxTokenIDLen+1)}, "[jti]"},
	} {
		var fields []string
		for _, f := range FieldsOf(tc.r.Normalize(now)) {
			fields = append(fields, f.Field)
		}
		got := ""
		if fields != nil {
			got = fmt.Sprint(fields)
		}
		if got != tc.want {
			t.Errorf("%+v: fields %s, want %s", tc.r, got, tc.want)
		}
	}
}
