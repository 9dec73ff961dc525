package registry

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

func TestCanonicalIPFilter(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want "": refused
		why      string // in the refusal
	}{
		{"10.0.0.7", "10.0.0.7", ""},
		{"2001:DB8::0:1", "2001:db8::1", ""},
		{"::ffff:10.0.0.7", "10.0.0.7", ""},
		{"10.0.0.0/24", "10.0.0.0/24", ""},
		{"10.0.0.7/32", "10.0.0.7", ""}, // one address: the address
		{"0.0.0.0/0", "0.0.0.0/0", ""},
		{"::/0", "::/0", ""},
		{"2001:DB8::/32", "2001:db8::/32", ""},
		{"fd00::1/128", "fd00::1", ""},
		{"::ffff:10.0.0.0/120", "10.0.0.0/24", ""}, // the IPv4 addresses nodes store
		{"::ffff:0.0.0.0/96", "0.0.0.0/0", ""},
		{"10.0.0.5/24", "", "bits set right of its /24 mask: the prefix is 10.0.0.0/24"},
		{"2001:db8::1/64", "", "bits set right of its /64 mask"},
		{"::ffff:10.0.0.0/95", "", "bits set right of its /95 mask"},
		{"10.0.0.0/33", "", "CIDR prefix"},
		{"10.0.0.0/", "", "CIDR prefix"},
		{"10.0.0/24", "", "CIDR prefix"},
		{"10.0.0.0/024", "", "CIDR prefix"},
		{"fe80::/64%eth0", "", ""},
		{"fe80::1%eth0/128", "", "zone"},
		{"0.0.0.0/32", "", "unspecified"},
		{"224.0.0.1/32", "", "multicast"},
		{"host", "", "IPv4 or IPv6 address"},
		{"", "", "IPv4 or IPv6 address"},
	} {
		got, err := CanonicalIPFilter(tc.in)
		switch {
		case tc.want != "" && (err != nil || got != tc.want):
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		case tc.want == "" && err == nil:
			t.Errorf("%q: accepted as %q, want a refusal", tc.in, got)
		case tc.want == "" && !strings.Contains(err.Error(), tc.why):
			t.Errorf("%q: refused with %q, want it to say %q", tc.in, err, tc.why)
		}
	}
}

// IPRange and IPMatches agree with netip.Prefix.Contains, which is what a
// CIDR filter means, for random prefixes and addresses near them.
func TestIPRangeAndMatches(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 11))
	for range 20000 {
		var a netip.Addr
		bits := 0
		if rnd.IntN(2) == 0 {
			a = netip.AddrFrom4([4]byte{10, byte(rnd.IntN(3)), byte(rnd.IntN(3)), byte(rnd.IntN(256))})
			bits = rnd.IntN(33)
		} else {
			var b [16]byte
			b[0], b[1], b[15] = 0x20, 0x01, byte(rnd.IntN(256))
			b[14] = byte(rnd.IntN(3))
			a = netip.AddrFrom16(b)
			bits = rnd.IntN(129)
		}
		p := netip.PrefixFrom(a, bits).Masked()
		filter, err := CanonicalIPFilter(p.String())
		if err != nil {
			continue // an address no host has, such as 0.0.0.0/32
		}
		first, last, err := IPRange(filter)
		if err != nil || first.Compare(last) > 0 || !p.Contains(first) || !p.Contains(last) {
			t.Fatalf("%s: range %s–%s, %v", p, first, last, err)
		}
		probe := a
		for range rnd.IntN(3) {
			probe = probe.Next()
		}
		if rnd.IntN(3) == 0 {
			probe = netip.AddrFrom4([4]byte{10, byte(rnd.IntN(3)), byte(rnd.IntN(3)), byte(rnd.IntN(256))})
		}
		if !probe.IsValid() {
			continue
		}
		want := p.Contains(probe)
		if got := IPMatches(filter, probe.String()); got != want {
			t.Fatalf("IPMatches(%s, %s) = %t, want %t", filter, probe, got, want)
		}
		inRange := probe.BitLen() == first.BitLen() && first.Compare(probe) <= 0 && probe.Compare(last) <= 0
		if inRange != want {
			t.Fatalf("%s: %s in %s–%s is %t, want %t", filter, probe, first, last, inRange, want)
		}
	}
	if IPMatches("10.0.0.0/24", "not an address") || IPMatches("10.0.0.1", "10.0.0.2") || !IPMatches("::102:304", "::1.2.3.4") {
		t.Error("IPMatches: edge cases wrong")
	}
}

func FuzzCanonicalIPFilter(f *testing.F) {
	for _, s := range []string{"10.0.0.0/24", "::ffff:10.0.0.0/120", "2001:db8::/32", "10.0.0.7", "10.0.0.5/24", "::/0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := CanonicalIPFilter(s)
		if err != nil {
			return
		}
		// Canonical is a fixed point, and every address it selects is
		// one its range holds.
		if again, err := CanonicalIPFilter(c); err != nil || again != c {
			t.Fatalf("%q → %q → %q, %v", s, c, again, err)
		}
		first, last, err := IPRange(c)
		if err != nil || !IPMatches(c, first.String()) || !IPMatches(c, last.String()) {
			t.Fatalf("%q: range %s–%s, %v", c, first, last, err)
		}
	})
}
