package registry

import (
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// MaxTokenIPs bounds the "ips" claim: a token is bound to a host or a few
// subnets, not to a routing table.
const MaxTokenIPs = 64

// ParseIPSet reads the entries of a token's "ips" claim: IPv4 or IPv6
// addresses ("10.0.0.7") or CIDR prefixes ("10.1.0.0/24"). Addresses become
// single-address prefixes; IPv4-mapped IPv6 forms become IPv4, as node
// addresses do (see CanonicalIP), so "::ffff:10.0.0.7" binds the node at
// "10.0.0.7". Refused: an empty list (it would bind to nothing; leave the
// claim out for an unbound token), more than MaxTokenIPs entries, zones,
// and prefixes with bits set beyond their length ("10.0.0.7/24" is
// ambiguous: the host or its subnet?).
func ParseIPSet(entries []string) ([]netip.Prefix, error) {
	if len(entries) == 0 {
		return nil, errText("must list at least one address or CIDR prefix")
	}
	if len(entries) > MaxTokenIPs {
		return nil, errText(fmt.Sprintf("must list at most %d addresses or prefixes", MaxTokenIPs))
	}
	out := make([]netip.Prefix, 0, len(entries))
	for _, e := range entries {
		p, err := parseIPEntry(e)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func parseIPEntry(e string) (netip.Prefix, error) {
	bad := func(why string) error {
		// Quote only a short, printable prefix of the entry: it comes from
		// a token and ends up in an answer.
		shown := e
		if len(shown) > 50 {
			shown = shown[:50] + "…"
		}
		if CheckLabel(shown, 60) != "" {
			shown = "(unprintable)"
		}
		return errText(fmt.Sprintf("%q %s", shown, why))
	}
	if strings.Contains(e, "%") {
		return netip.Prefix{}, bad("carries an IPv6 zone; a zone means nothing off the host")
	}
	if !strings.Contains(e, "/") {
		addr, err := netip.ParseAddr(e)
		if err != nil {
			return netip.Prefix{}, bad("is not an IP address or CIDR prefix")
		}
		addr = addr.Unmap()
		return netip.PrefixFrom(addr, addr.BitLen()), nil
	}
	p, err := netip.ParsePrefix(e)
	if err != nil {
		return netip.Prefix{}, bad("is not an IP address or CIDR prefix")
	}
	if p.Masked() != p {
		return netip.Prefix{}, bad(fmt.Sprintf("has bits set beyond its length; write %s for the subnet or the bare address for one host", p.Masked()))
	}
	// A masked prefix shorter than /96 clears part of ::ffff:, so only
	// prefixes inside the mapped range are Is4In6.
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p, nil
}

// FormatIPSet is the text of a principal's address set, for messages.
func FormatIPSet(set []netip.Prefix) string {
	parts := make([]string, len(set))
	for i, p := range set {
		if p.IsSingleIP() {
			parts[i] = p.Addr().String()
		} else {
			parts[i] = p.String()
		}
	}
	return strings.Join(parts, ", ")
}

// MayUseIP reports whether p may register, adopt or move a node to the
// address ip. A principal without an address set (IPs nil) may use any
// address; a bound one only addresses inside one of its prefixes.
// IPv4-mapped forms count as IPv4. An unparsable ip is never allowed.
func (p Principal) MayUseIP(ip string) bool {
	if p.IPs == nil {
		return true
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil || addr.Zone() != "" {
		return false
	}
	addr = addr.Unmap()
	for _, pre := range p.IPs {
		if pre.Contains(addr) {
			return true
		}
	}
	return false
}

// Revocation stops tokens before they expire, without rotating keys. It
// is one of two kinds:
//
//   - by subject (Sub set): every token of Sub issued before Before is
//     refused, and so is every token of Sub without "iat" (its issue time
//     is unknown). Tokens issued at or after Before are accepted.
//   - by token id (JTI set): the one token whose "jti" is JTI. Until is
//     when that token expires anyway (its "exp"), after which the
//     revocation may be forgotten; nil when unknown.
type Revocation struct {
	ID     int64
	Sub    string
	Before time.Time
	JTI    string
	Until  *time.Time
	At     time.Time // when it was last revoked
}

// MaxTokenIDLen bounds a "jti".
const MaxTokenIDLen = 200

// Normalize validates a revocation request: exactly one of Sub and JTI,
// each a sane label, and Until only with JTI and not before now. A past
// Until would let the revocation be forgotten while the token, whose real
// expiry the caller got wrong, still works.
func (r *Revocation) Normalize(now time.Time) error {
	var fe FieldErrors
	switch {
	case r.Sub == "" && r.JTI == "":
		fe.Add("sub", "give sub (every token of a principal) or jti (one token)")
	case r.Sub != "" && r.JTI != "":
		fe.Add("jti", "give sub or jti, not both")
	case r.Sub != "":
		if msg := CheckLabel(r.Sub, MaxPrincipalLen); msg != "" {
			fe.Add("sub", "%s", msg)
		}
		if r.Until != nil {
			fe.Add("until", "goes with jti only; a subject's revocation never lapses")
		}
	default:
		if msg := CheckLabel(r.JTI, MaxTokenIDLen); msg != "" {
			fe.Add("jti", "%s", msg)
		}
		if r.Until != nil && r.Until.Before(now) {
			fe.Add("until", "is in the past; give the token's expiry (its exp), or leave until out to keep the revocation for the longest lifetime a token may have")
		}
	}
	return fe.Err()
}

// RevocationSet is every revocation in force, as a replica keeps it in
// memory so that checking a token costs no query.
type RevocationSet struct {
	subs map[string]time.Time // sub → tokens issued before this are revoked
	jtis map[string]struct{}
}

// NewRevocationSet indexes rs. For a subject revoked more than once the
// latest instant wins.
func NewRevocationSet(rs []Revocation) *RevocationSet {
	s := &RevocationSet{subs: map[string]time.Time{}, jtis: map[string]struct{}{}}
	for _, r := range rs {
		switch {
		case r.Sub != "":
			if cur, ok := s.subs[r.Sub]; !ok || r.Before.After(cur) {
				s.subs[r.Sub] = r.Before
			}
		case r.JTI != "":
			s.jtis[r.JTI] = struct{}{}
		}
	}
	return s
}

// Len is the number of revocations in the set.
func (s *RevocationSet) Len() int { return len(s.subs) + len(s.jtis) }

// Revokes reports whether the set refuses a token of sub with id jti (""
// when it has none) issued at iat (nil when it carries no "iat").
func (s *RevocationSet) Revokes(sub, jti string, iat *time.Time) bool {
	if jti != "" {
		if _, ok := s.jtis[jti]; ok {
			return true
		}
	}
	before, ok := s.subs[sub]
	if !ok {
		return false
	}
	return iat == nil || iat.Before(before)
}
