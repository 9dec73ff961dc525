# registryd — the two commands that matter are `make run` and `make test`.
GO       ?= go
BIN      := bin/registryd
PKGS     := ./...

.PHONY: run build test vet fmt-check generate check-generated bench clean

## run: build and start registryd; with no REGISTRY_DATABASE_URL it runs its own PostgreSQL in ./.data
run: build
	REGISTRY_LOG_FORMAT=$${REGISTRY_LOG_FORMAT:-text} ./$(BIN) serve

build:
	$(GO) build -o $(BIN) ./cmd/registryd

## test: vet, format check, generated client current, and every test with the race detector, against a real PostgreSQL
test: vet fmt-check check-generated
	$(GO) test -race -count=1 $(PKGS)

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

clean:
	rm -rf bin
