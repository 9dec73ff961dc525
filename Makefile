# registryd — the two commands that matter are `make run` and `make test`.
GO       ?= go
BIN      := bin/registryd
PKGS     := ./...

.PHONY: run build test vet fmt-check bench clean

## run: build and start registryd; with no REGISTRY_DATABASE_URL it runs its own PostgreSQL in ./.data
run: build
	REGISTRY_LOG_FORMAT=$${REGISTRY_LOG_FORMAT:-text} ./$(BIN) serve

build:
	$(GO) build -o $(BIN) ./cmd/registryd

## test: vet, format check and every test with the race detector, against a real PostgreSQL
test: vet fmt-check
	$(GO) test -race -count=1 $(PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: Go benchmarks (never part of `make test`)
bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf bin
