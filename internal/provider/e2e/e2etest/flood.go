package e2etest

import (
	"bytes"
	"fmt"
	"net/http"
)

// flood writes page (from 1) of a list that never ends: perPage clusters,
// each named by nameBytes of 'c', ids and addresses numbered on from the
// page's first. One name is built per answer, and the answer goes out as
// it is written.
func flood(w http.ResponseWriter, perPage, page, nameBytes int, location string) {
	name := bytes.Repeat([]byte{'c'}, nameBytes)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"code":200,"errors":{},"message":"Success","data":[`))
	for i := range perPage {
		n := (page-1)*perPage + i
		if i > 0 {
			_, _ = w.Write([]byte{','})
		}
		fmt.Fprintf(w, `{"id":%d,"status":"Running","no_of_nodes":1,`+
			`"sku_details":{"specs":{"name":"GDC3.8xH100-640GB","cpu":96,"gpu":8,"memory":1024,"gpu_memory":640,"gpu_card_type":"H100"},"plan":{"location":%q}},`+
			`"worker_nodes":[{"id":1,"name":"worker-1","private_ip":"10.%d.%d.%d","status":"Running"}],"name":"`,
			n+1, location, n>>16&255, n>>8&255, n&255)
		if _, err := w.Write(name); err != nil {
			return // the client stopped reading
		}
		_, _ = w.Write([]byte(`"}`))
	}
	_, _ = w.Write([]byte("]}\n"))
}
