package api_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
)

// BenchmarkListCordonedPage lists the cordoned and draining nodes (a page
// of up to 100) out of 100,000 nodes of which 100 are cordoned: the
// question an admin asks during maintenance.
func BenchmarkListCordonedPage(b *testing.B) {
	url := benchServer(b, 100_000)
	client := benchClient(b)
	for i := range 100 {
		call(b, client, "POST", url+"/v1/nodes/cordon", fmt.Sprintf(`{"nodes":[%d],"reason":"bench"}`, 1+i*997), http.StatusOK)
	}
	b.ResetTimer()
	for b.Loop() {
		call(b, client, "POST", url+"/v1/nodes/list", `{"state":["cordoned","draining"],"limit":100}`, http.StatusOK)
	}
}

// BenchmarkCordonHost cordons the 8 nodes of a random host by filter and
// uncordons them by pk, out of 100,000 nodes (one op = both).
func BenchmarkCordonHost(b *testing.B) {
	const n = 100_000
	url := benchServer(b, n)
	client := benchClient(b)
	b.ResetTimer()
	for b.Loop() {
		h := rand.IntN(n / 8)
		ip := fmt.Sprintf("10.0.%d.%d", h>>8, h&255)
		call(b, client, "POST", url+"/v1/nodes/cordon", fmt.Sprintf(`{"ip":%q,"reason":"bench"}`, ip), http.StatusOK)
		first := 1 + h*8
		call(b, client, "POST", url+"/v1/nodes/uncordon",
			fmt.Sprintf(`{"nodes":[%d,%d,%d,%d,%d,%d,%d,%d]}`, first, first+1, first+2, first+3, first+4, first+5, first+6, first+7), http.StatusOK)
	}
}

// BenchmarkRenew renews the leases of a job holding 8 nodes, out of
// 100,000 nodes.
func BenchmarkRenew(b *testing.B) {
	url := benchServer(b, 100_000)
	client := benchClient(b)
	call(b, client, "POST", url+"/v1/nodes/claim", `{"job":7,"count":8,"same_host":true,"lease_seconds":600}`, http.StatusOK)
	b.ResetTimer()
	for b.Loop() {
		call(b, client, "POST", url+"/v1/nodes/renew", `{"job":7,"lease_seconds":600}`, http.StatusOK)
	}
}
