package store

import (
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/registryd/registryd/internal/registry"
)

// nodeColumns is the select list scanNode reads, in order, for queries
// whose node table is named nodes. last_seen lives in node_liveness (see
// migration 00006).
var nodeColumns = qualified("nodes")

// qualified is the select list for a node table named alias; last_seen
// comes from a subquery, cheap for the few rows most statements touch.
func qualified(alias string) string {
	return columns(alias, "(SELECT l.last_seen FROM node_liveness l WHERE l.node_pk = "+alias+".pk)")
}

// withLiveness is the select list for a query that joins node_liveness as
// l: bulk reads, where a join beats a subquery per row.
func withLiveness(alias string) string { return columns(alias, "l.last_seen") }

// nodeFields is a node as the store reads it: each select-list
// expression ({t} is the node table's alias, {last_seen} where last_seen
// comes from), in order, with the field scanNode reads it into. One list,
// so a new column is one line.
var nodeFields = [...]struct {
	expr string
	oid  uint32 // its type, as decodeNode reads it
	dest func(n *registry.Node) any
}{
	{"{t}.pk", pgtype.Int8OID, func(n *registry.Node) any { return &n.PK }},
	{"host({t}.ip)", pgtype.TextOID, func(n *registry.Node) any { return &n.IP }},
	{"{t}.gpu_index", pgtype.Int4OID, func(n *registry.Node) any { return &n.Index }},
	{"{t}.cpu_mem", pgtype.Int8OID, func(n *registry.Node) any { return &n.CPUMem }},
	{"{t}.driver_version", pgtype.TextOID, func(n *registry.Node) any { return &n.DriverVersion }},
	{"{t}.hardware_generation", pgtype.Int8OID, func(n *registry.Node) any { return &n.HardwareGeneration }},
	{"{t}.gpu_mem", pgtype.Int8OID, func(n *registry.Node) any { return &n.GPUMem }},
	{"{t}.gpu_model", pgtype.TextOID, func(n *registry.Node) any { return &n.GPUModel }},
	{"{t}.gpu_uuid", pgtype.TextOID, func(n *registry.Node) any { return &n.GPUUUID }},
	{"{t}.fabric", pgtype.TextOID, func(n *registry.Node) any { return &n.Fabric }},
	{"{t}.labels", pgtype.JSONBOID, func(n *registry.Node) any { return &n.Labels }},
	{"{last_seen}", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.LastSeen }},
	{"{t}.current_job", pgtype.Int8OID, func(n *registry.Node) any { return &n.CurrentJob }},
	{"{t}.lease_expires_at", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.LeaseExpiresAt }},
	{"{t}.owner", pgtype.TextOID, func(n *registry.Node) any { return &n.Owner }},
	{"{t}.source", pgtype.TextOID, func(n *registry.Node) any { return &n.Source }},
	{"{t}.schedulable", pgtype.BoolOID, func(n *registry.Node) any { return &n.Schedulable }},
	{"{t}.lost", pgtype.BoolOID, func(n *registry.Node) any { return &n.Lost }},
	{"{t}.cordon_reason", pgtype.TextOID, func(n *registry.Node) any { return &n.CordonReason }},
	{"{t}.external_id", pgtype.TextOID, func(n *registry.Node) any { return &n.ExternalID }},
	{"{t}.provider_state", pgtype.TextOID, func(n *registry.Node) any { return &n.ProviderState }},
	{"{t}.created_at", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.CreatedAt }},
	{"{t}.updated_at", pgtype.TimestamptzOID, func(n *registry.Node) any { return &n.UpdatedAt }},
	{"{t}.version", pgtype.Int8OID, func(n *registry.Node) any { return &n.Version }},
}

func columns(alias, lastSeen string) string {
	r := strings.NewReplacer("{t}", alias, "{last_seen}", lastSeen)
	exprs := make([]string, len(nodeFields))
	for i, f := range nodeFields {
		exprs[i] = r.Replace(f.expr)
	}
	return strings.Join(exprs, ", ")
}

// scanNode reads a row of nodeFields, times in UTC, its state derived.
func scanNode(row pgx.CollectableRow) (registry.Node, error) {
	var n registry.Node
	err := row.Scan(nodeDests(&n)...)
	n.State = n.DeriveState()
	return n.UTC(), err
}

// nodeDests are the scan destinations of nodeFields in n, in order.
func nodeDests(n *registry.Node) []any {
	dests := make([]any, len(nodeFields), len(nodeFields)+1)
	for i, f := range nodeFields {
		dests[i] = f.dest(n)
	}
	return dests
}
