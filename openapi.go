// Package registryd is the root of the registryd module: the worker-node
// registry of a GPU compute fleet. It carries the API contract so that the
// binary can serve it and tests can check the server against it.
package registryd

import _ "embed"

// OpenAPI is the OpenAPI 3.0 document of the HTTP API (openapi.yaml), served
// at /openapi.yaml and used by the contract tests.
//
//go:embed openapi.yaml
var OpenAPI []byte
