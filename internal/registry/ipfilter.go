package registry

import (
	"fmt"
	"net/netip"
	"strings"
)

// CanonicalIPFilter validates the ip of a node filter: a host's address
// (CanonicalIP's rules) or a CIDR prefix of addresses, such as 10.0.0.0/24
// or fd00::/64. It returns the canonical form: an address in CanonicalIP's
// text, a prefix masked and, for IPv4-mapped IPv6, as the IPv4 prefix it
// covers (nodes store unmapped addresses). A prefix of one address is
// that address. A prefix with bits set right of its mask (10.0.0.5/24) is
// refused, not masked: it may as well mean the host.
func CanonicalIPFilter(s string) (string, error) {
	if !strings.Contains(s, "/") {
		return CanonicalIP(s)
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		if strings.Contains(s, "%") {
			return "", errText("must not carry an IPv6 zone")
		}
		return "", errText("must be an IPv4 or IPv6 address, or a CIDR prefix such as 10.0.0.0/24")
	}
	if p != p.Masked() {
		return "", errText(fmt.Sprintf("has bits set right of its /%d mask: the prefix is %s, the host %s", p.Bits(), p.Masked(), p.Addr()))
	}
	if a := p.Addr(); a.Is4In6() {
		// Masked and IPv4-mapped: /96 or longer, the ::ffff: bits kept.
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if p.IsSingleIP() {
		return CanonicalIP(p.Addr().String())
	}
	return p.String(), nil
}

// IPRange is the first and last address an ip filter in CanonicalIPFilter's
// form selects, equal for an address. Every address between them, of the
// same family, is selected: SQL compares a node's ip with the two.
func IPRange(filter string) (first, last netip.Addr, err error) {
	if !strings.Contains(filter, "/") {
		a, err := netip.ParseAddr(filter)
		return a, a, err
	}
	p, err := netip.ParsePrefix(filter)
	if err != nil {
		return first, last, err
	}
	first = p.Masked().Addr()
	b := first.AsSlice()
	for i := range b {
		// Bits past the prefix length set to one.
		host := p.Bits() - 8*i
		switch {
		case host <= 0:
			b[i] = 0xff
		case host < 8:
			b[i] |= 0xff >> host
		}
	}
	last, _ = netip.AddrFromSlice(b)
	return first, last, nil
}

// IPMatches reports whether the node address addr is selected by the ip
// filter (CanonicalIPFilter's form). Addresses are compared as values, as
// PostgreSQL compares inet, not as text: ::1.2.3.4 and ::102:304 are one.
func IPMatches(filter, addr string) bool {
	if filter == addr {
		return true
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	if !strings.Contains(filter, "/") {
		f, err := netip.ParseAddr(filter)
		return err == nil && f == a
	}
	p, err := netip.ParsePrefix(filter)
	return err == nil && p.Contains(a)
}
