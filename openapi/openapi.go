// Package openapi holds the OpenAPI description of the backend's HTTP API
// (arap.yaml), served at /openapi.yaml and checked against real responses
// by the contract tests.
package openapi

import (
	_ "embed"
	"net/http"
)

//go:embed arap.yaml
var Spec []byte

// Path is where the backend serves the document.
const Path = "/openapi.yaml"

// Handler serves the document.
func Handler(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(Spec)
}
