package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// hardwareJSON is a hardware generation on the wire.
type hardwareJSON struct {
	PK        int64     `json:"pk"`
	Name      string    `json:"name"`
	Nodes     int64     `json:"nodes"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func toHardwareJSON(h registry.Hardware) hardwareJSON {
	return hardwareJSON{PK: h.PK, Name: h.Name, Nodes: h.Nodes, CreatedAt: h.CreatedAt.UTC(), UpdatedAt: h.UpdatedAt.UTC()}
}

func readHardwareEcho(f *fields) registry.HardwareEcho {
	return registry.HardwareEcho{
		PK:        f.int64("pk", true),
		CreatedAt: f.stamp("created_at"),
		UpdatedAt: f.stamp("updated_at"),
		Nodes:     f.int64("nodes", true),
	}
}

func (s *Server) createHardware(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	name := f.string("name", false)
	f.require("name")
	if err := f.err(); err != nil {
		return err
	}
	h, err := s.store.CreateHardware(r.Context(), actor(r), registry.HardwareSpec{Name: name.Value})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/hardware/"+strconv.FormatInt(h.PK, 10))
	w.Header().Set("ETag", hardwareTag(h))
	return writeJSON(w, http.StatusCreated, toHardwareJSON(h))
}

func (s *Server) getHardware(w http.ResponseWriter, r *http.Request) error {
	pk, err := pathPK(r, "hardware generation")
	if err != nil {
		return err
	}
	h, err := s.store.GetHardware(r.Context(), pk)
	if err != nil {
		return err
	}
	if notModified(w, r, hardwareTag(h)) {
		return nil
	}
	return writeJSON(w, http.StatusOK, toHardwareJSON(h))
}

func (s *Server) updateHardware(w http.ResponseWriter, r *http.Request) error {
	return s.writeHardware(w, r, true)
}

func (s *Server) patchHardware(w http.ResponseWriter, r *http.Request) error {
	return s.writeHardware(w, r, false)
}

func (s *Server) writeHardware(w http.ResponseWriter, r *http.Request, full bool) error {
	pk, err := pathPK(r, "hardware generation")
	if err != nil {
		return err
	}
	obj, err := decodeObject(w, r, false)
	if err != nil {
		return err
	}
	f := newFields(obj)
	p := registry.HardwarePatch{Name: f.string("name", false)}
	echo := readHardwareEcho(f)
	if full {
		f.require("name")
	}
	if err := f.err(); err != nil {
		return err
	}
	match := ifMatch(r)
	h, err := s.store.UpdateHardware(r.Context(), actor(r), pk, func(cur registry.Hardware) (registry.HardwareSpec, error) {
		if match != nil {
			if err := match(hardwareTag(cur)); err != nil {
				return registry.HardwareSpec{}, err
			}
		}
		if err := echo.Check(cur); err != nil {
			return registry.HardwareSpec{}, err
		}
		return p.Apply(registry.HardwareSpec{Name: cur.Name}), nil
	})
	if err != nil {
		return err
	}
	w.Header().Set("ETag", hardwareTag(h))
	return writeJSON(w, http.StatusOK, toHardwareJSON(h))
}

func (s *Server) deleteHardware(w http.ResponseWriter, r *http.Request) error {
	pk, err := pathPK(r, "hardware generation")
	if err != nil {
		return err
	}
	var check func(registry.Hardware) error
	if match := ifMatch(r); match != nil {
		check = func(cur registry.Hardware) error { return match(hardwareTag(cur)) }
	}
	if _, err := s.store.DeleteHardware(r.Context(), actor(r), pk, check); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listHardware answers every hardware generation, or the one whose name is
// given: {"name": "H100"}.
func (s *Server) listHardware(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, true)
	if err != nil {
		return err
	}
	f := newFields(obj)
	name := f.string("name", false)
	if err := f.err(); err != nil {
		return err
	}
	hs, err := s.store.ListHardware(r.Context())
	if err != nil {
		return err
	}
	out := make([]hardwareJSON, 0, len(hs))
	for _, h := range hs {
		if name.Set && h.Name != name.Value {
			continue
		}
		out = append(out, toHardwareJSON(h))
	}
	return writeJSON(w, http.StatusOK, out)
}

// listFabrics is POST /v1/fabrics/list: per fabric, what the nodes the
// list filters select hold (registry.FabricCapacity).
func (s *Server) listFabrics(w http.ResponseWriter, r *http.Request) error {
	obj, err := decodeObject(w, r, true)
	if err != nil {
		return err
	}
	f := newFields(obj)
	nf := readFilterFields(f)
	for _, name := range []string{"after", "limit"} {
		if _, ok := obj[name]; ok && !f.errs.Has(name) {
			f.errs.Add(name, "is a list option; the capacity counts every node the filters select")
		}
	}
	nf.After, nf.Limit = 0, 0
	f.check(nf.Normalize())
	if err := f.err(); err != nil {
		return err
	}
	caps, err := s.store.FabricCapacity(r.Context(), nf)
	if err != nil {
		return err
	}
	type freeHosts struct {
		Free  int64 `json:"free"`
		Hosts int64 `json:"hosts"`
	}
	type fabricJSON struct {
		Fabric    *string          `json:"fabric"`
		Hosts     int64            `json:"hosts"`
		Nodes     map[string]int64 `json:"nodes"`
		FreeHosts []freeHosts      `json:"free_hosts"`
	}
	out := make([]fabricJSON, len(caps))
	for i, c := range caps {
		out[i] = fabricJSON{Fabric: c.Fabric, Hosts: c.Hosts, Nodes: map[string]int64{}, FreeHosts: []freeHosts{}}
		for st, n := range c.Nodes {
			out[i].Nodes[string(st)] = n
		}
		for _, fh := range c.FreeHosts {
			out[i].FreeHosts = append(out[i].FreeHosts, freeHosts(fh))
		}
	}
	return writeJSON(w, http.StatusOK, out)
}
