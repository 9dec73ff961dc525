package scptest

import (
	"bytes"
	"fmt"
	"net/http"
)

// FloodCount is the count a flooded list reports.
const FloodCount = 1000000

// flood writes page of a list that never ends: size nodes of product, each
// named by nameBytes of 'n', ids and addresses numbered from page*size.
// One name is built per answer, and the answer goes out as it is written.
func flood(w http.ResponseWriter, size, page, nameBytes int, product string) {
	name := bytes.Repeat([]byte{'n'}, nameBytes)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, `{"count":%d,"gpu_nodes":[`, FloodCount)
	for i := range size {
		n := page*size + i
		if i > 0 {
			_, _ = w.Write([]byte{','})
		}
		fmt.Fprintf(w, `{"id":"flood-%d","policy_ip":"10.%d.%d.%d","server_type":%q,"state":"RUNNING","gpu_node_name":"`,
			n, n>>16&255, n>>8&255, n&255, product)
		if _, err := w.Write(name); err != nil {
			return // the client stopped reading
		}
		_, _ = w.Write([]byte(`"}`))
	}
	_, _ = w.Write([]byte("]}\n"))
}
