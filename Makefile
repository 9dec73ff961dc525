# registryd — the two commands that matter are `make run` and `make test`.
GO       ?= go
BIN      := bin/registryd
PKGS     := ./...

# What `registryd version` and registryd_build_info say, stamped into the
# binary by -X (cmd/registryd/version.go): git describe's version (a tag,
# v0.1.0, for a tagged commit; TAG-N-gHASH after one; the bare hash with no
# tag; -dirty with uncommitted changes), the commit and its time. Outside a
# git checkout they are empty and the binary falls back to what Go records.
# Each may be given: make release VERSION=v0.1.0.
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null)
REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null)
COMMIT_TIME ?= $(shell TZ=UTC0 git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null)
VERSION     := $(VERSION)
REVISION    := $(REVISION)
COMMIT_TIME := $(COMMIT_TIME)
STAMP       := -X main.version=$(VERSION) -X main.revision=$(REVISION) -X main.commitTime=$(COMMIT_TIME)

# Swagger UI, served at /docs: the npm package swagger-ui-dist, pinned by
# version and by the integrity npm publishes for it (npm view
# swagger-ui-dist@VERSION dist.integrity). Its files are committed under
# SWAGGER_UI_DIR, so builds and tests never need the network; `make
# swagger-ui` is only for upgrading (change both pins, run it, commit).
SWAGGER_UI_VERSION   := 5.35.0
SWAGGER_UI_INTEGRITY := sha512-U06rpMtW9V3XPGOBeamTUSr0Z09jMX4IJuANpE/EZbAhw0G8CgwrzU4YmXkn/h0wCDNsXdGarTNNHC3sU8yVUQ==
SWAGGER_UI_DIR       := internal/docs/ui/swagger-ui
SWAGGER_UI_FILES     := swagger-ui.css swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt \
                        favicon-16x16.png favicon-32x32.png LICENSE NOTICE

.PHONY: run build release test vet fmt-check generate check-generated deploy-test bench bench-http clean swagger-ui

## run: build and start registryd; with no REGISTRY_DATABASE_URL it runs its own PostgreSQL in ./.data
run: build
	REGISTRY_LOG_FORMAT=$${REGISTRY_LOG_FORMAT:-text} ./$(BIN) serve

## build: bin/registryd, stamped with its version, commit and build time (registryd version)
build:
	$(GO) build -ldflags "$(STAMP) -X main.buildTime=$$(date -u +%Y-%m-%dT%H:%M:%SZ)" -o $(BIN) ./cmd/registryd

## release: dist/, for VERSION (make release VERSION=v0.1.0 outside a git checkout): static binaries for
## linux/amd64 and linux/arm64, a CycloneDX SBOM each, the server's image (an OCI layout in a tar, for
## skopeo or crane) and SHA256SUMS; docs/operating.md, "Releases"
# The SBOM tool is run at a pinned version from the Go module proxy, built
# for this machine (-exec hands it the target's GOOS and GOARCH, which it
# reads). CA_CERTS are the certificates the image trusts: this machine's.
DIST       := dist
PLATFORMS  := linux/amd64 linux/arm64
CYCLONEDX  := github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0
CA_CERTS   ?= /etc/ssl/certs/ca-certificates.crt
release:
	@if [ -z "$(VERSION)" ]; then echo "make release: no version: not a git checkout; say which, make release VERSION=v0.1.0" >&2; exit 1; fi
	rm -rf $(DIST) && mkdir -p $(DIST)
	@set -e; for p in $(PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/registryd_$(VERSION)_$${os}_$${arch}; \
		echo "$$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w $(STAMP)" -o $$out ./cmd/registryd; \
		echo "$$out.cdx.json"; \
		CGO_ENABLED=0 $(GO) run -exec "env GOOS=$$os GOARCH=$$arch" $(CYCLONEDX) app -json -licenses -std -noserial -notimestamp \
			-main cmd/registryd -output $$out.cdx.json . 2>$(DIST)/.sbom.log || { cat $(DIST)/.sbom.log >&2; exit 1; }; \
		binaries="$$binaries -binary $$p=../$$out"; \
	done; rm -f $(DIST)/.sbom.log; \
	cd deploy && $(GO) run ./cmd/registryd-image -version "$(VERSION)" -revision "$(REVISION)" -created "$(COMMIT_TIME)" \
		-ca-certs "$(CA_CERTS)" $$binaries -o ../$(DIST)/registryd_$(VERSION)_oci.tar
	cd $(DIST) && sha256sum registryd_* > SHA256SUMS
	@ls -l $(DIST)

## test: vet, format check, generated client current, and every test with the race detector, against a real PostgreSQL
test: vet fmt-check check-generated deploy-test
	$(GO) test -race -count=1 $(PKGS)

## deploy-test: the Kubernetes manifests and docker-compose.yml, checked by deploy/, and the release's image builder (cmd/registryd-image), a Go module of its own (so k8s.io, compose-go and go-containerregistry stay out of registryd's)
deploy-test:
	cd deploy && $(GO) vet ./... && $(GO) test -race -count=1 ./...

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## generate: regenerate the Go client's code from openapi.yaml (oapi-codegen, pinned in client/internal/oapi/generate.go)
generate:
	$(GO) generate ./client/internal/oapi/

## check-generated: regenerate the client and fail if that changed it, so openapi.yaml and the client cannot drift
GENERATED := client/internal/oapi/oapi.gen.go
check-generated:
	@before=$$(mktemp) && cp $(GENERATED) $$before && \
	if ! $(GO) generate ./client/internal/oapi/; then rm -f $$before; exit 1; fi; \
	if ! cmp -s $$before $(GENERATED); then \
		diff -u $$before $(GENERATED) | head -40; rm -f $$before; \
		echo "$(GENERATED) did not match openapi.yaml: it is regenerated now; review and commit it"; exit 1; \
	fi; rm -f $$before

## bench: Go benchmarks (never part of `make test`)
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

## bench-http: registryd through HTTP against pgbench running the same SQL, on a fleet seeded through SQL, or with -seed api through the API as a real fleet arrives (cmd/registryd-bench; flags in BENCH_HTTP_FLAGS, e.g. BENCH_HTTP_FLAGS='-nodes 1000000 -duration 30s')
BENCH_HTTP_FLAGS ?=
bench-http: build
	$(GO) run ./cmd/registryd-bench -registryd $(BIN) $(BENCH_HTTP_FLAGS)

clean:
	rm -rf bin $(DIST)

## swagger-ui: fetch the pinned swagger-ui-dist with npm (tarball only: no install, no scripts), check its integrity, copy the files /docs serves into SWAGGER_UI_DIR
swagger-ui:
	@set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	(cd "$$tmp" && npm pack --silent swagger-ui-dist@$(SWAGGER_UI_VERSION) >/dev/null); \
	tgz="$$tmp/swagger-ui-dist-$(SWAGGER_UI_VERSION).tgz"; \
	got=$$(node -e 'process.stdout.write("sha512-" + require("crypto").createHash("sha512").update(require("fs").readFileSync(process.argv[1])).digest("base64"))' "$$tgz"); \
	if [ "$$got" != "$(SWAGGER_UI_INTEGRITY)" ]; then \
		echo "swagger-ui-dist@$(SWAGGER_UI_VERSION): integrity $$got, want $(SWAGGER_UI_INTEGRITY)" >&2; exit 1; fi; \
	tar -xzf "$$tgz" -C "$$tmp"; \
	rm -rf $(SWAGGER_UI_DIR); mkdir -p $(SWAGGER_UI_DIR); \
	for f in $(SWAGGER_UI_FILES); do cp "$$tmp/package/$$f" $(SWAGGER_UI_DIR)/; done; \
	echo $(SWAGGER_UI_VERSION) > $(SWAGGER_UI_DIR)/VERSION; \
	(cd $(SWAGGER_UI_DIR) && sha256sum $(SWAGGER_UI_FILES) > SHA256SUMS); \
	echo "swagger-ui-dist $(SWAGGER_UI_VERSION) is in $(SWAGGER_UI_DIR); commit it"
