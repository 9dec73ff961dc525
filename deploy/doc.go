// Package deploy checks registryd's deployment files: the Kubernetes
// manifests under k8s/ (built with kustomize and decoded strictly into the
// Kubernetes API types) and the repository's docker-compose.yml. It is a
// Go module of its own so that the Kubernetes, kustomize and compose
// libraries, and go-containerregistry, which cmd/registryd-image builds
// the release's image with, stay out of registryd's; `make test` runs it.
package deploy
