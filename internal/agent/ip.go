package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
)

// RouteIP returns the local address of the route to server's host: the
// address the host's packets to the server leave from, which is how the
// server and the fleet know this host. It "connects" a UDP socket, which
// sends nothing: the kernel only picks the route and the source address.
// A host name is resolved first. A link-local address (with an IPv6 zone)
// or an unspecified one cannot name a node; set REGISTRY_AGENT_IP then.
func RouteIP(ctx context.Context, server *url.URL) (string, error) {
	port := server.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[server.Scheme]
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", net.JoinHostPort(server.Hostname(), port))
	if err != nil {
		return "", fmt.Errorf("find the local address of the route to %s: %w", server.Host, err)
	}
	defer conn.Close()
	ap, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return "", fmt.Errorf("find the local address of the route to %s: %w", server.Host, err)
	}
	addr := ap.Addr().Unmap()
	if addr.Zone() != "" || addr.IsUnspecified() || addr.IsLinkLocalUnicast() {
		return "", fmt.Errorf("the route to %s leaves from %s, which cannot name this host; set REGISTRY_AGENT_IP", server.Host, ap.Addr())
	}
	return addr.String(), nil
}
