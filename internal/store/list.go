package store

import (
	"context"
	"fmt"

	"github.com/registryd/registryd/internal/registry"
)

// ListNodes returns the nodes matching f, ordered by pk. Callers that want
// every node page through with f.After and f.Limit so that no single query
// holds a connection for a slow reader.
func (s *Store) ListNodes(ctx context.Context, f registry.NodeFilter) ([]registry.Node, error) {
	if err := f.Normalize(); err != nil {
		return nil, err
	}
	// The slice sized for the page: a page of 100 is the free list
	// schedulers read all day.
	return s.listInto(ctx, f, make([]registry.Node, 0, min(max(f.Limit, 16), 1000)), nil)
}

// listInto is ListNodes for a normalized filter, appending to nodes and
// decoding what their pointer fields point at into backings, then into
// chunks of its own once they are used up.
func (s *Store) listInto(ctx context.Context, f registry.NodeFilter, nodes []registry.Node, backings []nodeBacking) ([]registry.Node, error) {
	sql, args := listQuery(f)
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list nodes: %w", translate(err))
	}
	defer rows.Close()
	// Rows decoded from their bytes (rawscan.go), with one set of scan
	// destinations for any row left to pgx.
	var n registry.Node
	dests := nodeDests(&n)
	dec := nodeDecoder{backings: backings}
	raw := rawDecodable(rows.FieldDescriptions())
	for rows.Next() {
		if err := dec.scanNodeRow(rows, raw, &n, dests); err != nil {
			return nil, fmt.Errorf("store: list nodes: %w", translate(err))
		}
		nodes = append(nodes, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list nodes: %w", translate(err))
	}
	return nodes, nil
}
