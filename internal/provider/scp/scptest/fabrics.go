package scptest

import (
	"fmt"
	"net/http"
	"strings"
)

// topology is where Nodes[i] sits. Call it with s.mu held.
func (s *Server) topology(i int) Topology {
	if t := s.Nodes[i].Topology; t != nil {
		return *t
	}
	per := s.HostsPerFabric
	if per <= 0 {
		per = DefaultHostsPerFabric
	}
	region := s.Region
	if region == "" {
		region = DefaultRegion
	}
	if region != s.genRegion {
		s.generated, s.genRegion = nil, region
	}
	k := i / per
	for len(s.generated) <= k {
		s.generated = append(s.generated, generatedFabric(len(s.generated), region))
	}
	return s.generated[k]
}

// generatedFabric is fabric number k of a generated fleet in region. The
// same k and region give the same fabric in every fake.
func generatedFabric(k int, region string) Topology {
	pool := k / fabricsPerPool
	return Topology{
		FabricID:   fmt.Sprintf("%016x%016x", mix(uint64(k)), mix(uint64(k)^0x5ca1ab1e)),
		FabricName: fmt.Sprintf("cluster%03d", k+1),
		NodePoolID: fmt.Sprintf("POOL%03d-%s%c", pool+1, zone(region), 'a'+rune(pool%2)),
		RegionID:   region,
	}
}

// mix is splitmix64's finaliser: ids that look random and never repeat
// for different k.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// zone is a region as node pool ids abbreviate it: kr-west1 → krw1.
func zone(region string) string {
	country, rest, ok := strings.Cut(region, "-")
	if !ok || rest == "" {
		return region
	}
	return country + rest[:1] + strings.TrimLeft(rest, "abcdefghijklmnopqrstuvwxyz")
}

// fabric is one cluster fabric: its topology, from its first node, and its
// nodes in the order of Server.Nodes.
type fabric struct {
	Topology
	members []int // indexes into Server.Nodes
}

// fabrics groups the nodes by fabric id. Call it with s.mu held.
func (s *Server) fabrics() []*fabric {
	var list []*fabric
	byID := map[string]*fabric{}
	for i := range s.Nodes {
		t := s.topology(i)
		if t.FabricID == "" {
			continue
		}
		f := byID[t.FabricID]
		if f == nil {
			f = &fabric{Topology: t}
			byID[t.FabricID] = f
			list = append(list, f)
		}
		f.members = append(f.members, i)
	}
	return list
}

func (s *Server) listFabrics(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	size, page, ok := pageParams(w, q)
	if !ok {
		return
	}
	name, pool, state := q.Get("cluster_fabric_name"), q.Get("node_pool_id"), q.Get("state")

	s.mu.Lock()
	var match []*fabric
	for _, f := range s.fabrics() {
		if (name == "" || f.FabricName == name) && (pool == "" || f.NodePoolID == pool) && (state == "" || state == "RUNNING") {
			match = append(match, f)
		}
	}
	items := []map[string]any{}
	if start := page * size; start < len(match) {
		for _, f := range match[start:min(start+size, len(match))] {
			items = append(items, s.fabricJSON(f))
		}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"count": len(match), "cluster_fabrics": items})
}

func (s *Server) showFabric(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.fabrics() {
		if f.FabricID == id {
			writeJSON(w, http.StatusOK, s.fabricJSON(f))
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("cluster fabric %s not found", id))
}

// fabricJSON is a ClusterFabricShowResponse. The fabric's product is its
// first node's. Call it with s.mu held.
func (s *Server) fabricJSON(f *fabric) map[string]any {
	account := s.AccountID
	if account == "" {
		account = AccountID
	}
	first := s.Nodes[f.members[0]]
	details := make([]map[string]any, 0, len(f.members))
	for _, i := range f.members {
		n := s.Nodes[i]
		details = append(details, map[string]any{
			"gpu_node_id":     n.ID,
			"gpu_node_name":   n.Name,
			"policy_ip":       n.PolicyIP,
			"product_type_id": n.ProductTypeID,
			"server_type":     n.ServerType,
			"state":           n.State,
		})
	}
	return map[string]any{
		"account_id":        account,
		"cluster_name":      f.FabricName,
		"created_at":        "2024-05-17T00:23:17Z",
		"created_by":        "90dddfc2b1e04edba54ba2b41539a9ac",
		"description":       "",
		"gpu_node_details":  details,
		"id":                f.FabricID,
		"modified_at":       "2024-05-17T00:23:17Z",
		"modified_by":       "90dddfc2b1e04edba54ba2b41539a9ac",
		"node_pool_id":      f.NodePoolID,
		"pirp_id":           nil,
		"product_id":        first.ProductTypeID,
		"region_id":         f.RegionID,
		"server_type":       first.ServerType,
		"state":             "RUNNING",
		"used_server_count": len(f.members),
	}
}
