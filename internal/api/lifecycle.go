package api

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"

	"github.com/registryd/registryd/internal/jsonscan"
	"github.com/registryd/registryd/internal/registry"
)

// parseStates reads the state filter: one state name or an array of them
// (at least one, at most one per state there is). Whether the names are
// states is NodeFilter.Normalize's to judge.
func parseStates(v json.RawMessage) ([]registry.State, string) {
	const notStates = "must be a node state or an array of node states"
	if len(v) > 0 && v[0] == '"' {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return nil, notStates
		}
		return []registry.State{registry.State(s)}, ""
	}
	if len(v) == 0 || v[0] != '[' {
		return nil, notStates
	}
	out := []registry.State{}
	var msg string
	err := jsonscan.Elements(v, bodyScan, func(elem []byte) bool {
		var s string
		if len(elem) == 0 || elem[0] != '"' || json.Unmarshal(elem, &s) != nil {
			msg = notStates
			return false
		}
		out = append(out, registry.State(s))
		if len(out) > len(registry.States) {
			msg = "must list at most " + strconv.Itoa(len(registry.States)) + " states"
			return false
		}
		return true
	})
	switch {
	case msg != "":
		return nil, msg
	case err != nil:
		return nil, notStates
	case len(out) == 0:
		return nil, "must name at least one state"
	}
	return out, ""
}

type notDoneJSON struct {
	PK     int64  `json:"pk"`
	Reason string `json:"reason"`
}

func notDoneList(nd []registry.NotDone) []notDoneJSON {
	out := make([]notDoneJSON, len(nd))
	for i, n := range nd {
		out[i] = notDoneJSON{PK: n.PK, Reason: n.Reason}
	}
	return out
}

type cordonJSON struct {
	Cordoned    []registry.Node `json:"cordoned"`
	NotCordoned []notDoneJSON   `json:"not_cordoned"`
}

type uncordonJSON struct {
	Uncordoned    []registry.Node `json:"uncordoned"`
	NotUncordoned []notDoneJSON   `json:"not_uncordoned"`
}

// readPKList reads a member that lists node pks; absent or null: nil.
func readPKList(f *fields, name string) []int64 {
	raw, ok := f.raw(name)
	if !ok || isNull(raw) {
		return nil
	}
	pks, msg := parseIntArray(raw, registry.MaxCordon)
	if msg != "" {
		f.errs.Add(name, "%s", msg)
		return []int64{} // present, and already refused
	}
	if pks == nil {
		pks = []int64{}
	}
	return pks
}

// cordonNodes is POST /v1/nodes/cordon: {"reason": "…", "nodes": [pk, …]}
// or {"reason": "…", ...list filters}; admins only.
func (s *Server) cordonNodes(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	var c registry.Cordon
	c.Reason = f.string("reason", false).Value
	f.require("reason")
	c.Nodes = readPKList(f, "nodes")
	known := maps.Clone(f.used)
	filter := readFilterFields(f)
	for name := range f.used {
		if _, present := obj[name]; present && !known[name] {
			c.Filter = &filter // at least one filter member was sent
			break
		}
	}
	f.check(c.Normalize())
	if err := f.err(); err != nil {
		return err
	}
	nodes, notDone, err := s.store.CordonNodes(r.Context(), actor(r), c)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, cordonJSON{Cordoned: nodesJSON(nodes), NotCordoned: notDoneList(notDone)})
}

// uncordonNodes is POST /v1/nodes/uncordon: {"nodes": [pk, …]}; admins
// only.
func (s *Server) uncordonNodes(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	var u registry.Uncordon
	u.Nodes = readPKList(f, "nodes")
	f.check(u.Normalize())
	if err := f.err(); err != nil {
		return err
	}
	nodes, notDone, err := s.store.UncordonNodes(r.Context(), actor(r), u)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, uncordonJSON{Uncordoned: nodesJSON(nodes), NotUncordoned: notDoneList(notDone)})
}

// renewLeases is POST /v1/nodes/renew: {"job": J, "lease_seconds": N}.
func (s *Server) renewLeases(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	var rn registry.Renewal
	rn.Job = f.int64("job", false).Value
	if o := f.int64("lease_seconds", false); o.Set {
		rn.Lease = seconds(o.Value)
	}
	f.require("job", "lease_seconds")
	f.check(rn.Normalize())
	if err := f.err(); err != nil {
		return err
	}
	nodes, expired, err := s.store.RenewLeases(r.Context(), actor(r), rn)
	if err != nil {
		return err
	}
	if expired == nil {
		expired = []int64{}
	}
	return writeJSON(w, http.StatusOK, renewJSON{claimJSON: claimJSON{Job: rn.Job, Nodes: nodesJSON(nodes)}, Expired: expired})
}
