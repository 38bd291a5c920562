# pgque's everyday commands. Run `make help` for the list.
#
# Tests and the demo start a throwaway PostgreSQL from the server binaries
# installed on this machine (see internal/pgcluster), or use the database in
# PGQUE_TEST_DSN when it is set.

export PATH := /usr/local/go/bin:$(PATH)

GO       ?= go
FUZZTIME ?= 30s
# Every module of the workspace (go.work): `./...` stops at a nested go.mod,
# so each module is named.
PKGS     := ./... ./cmd/pgque/... ./pgqueotel/... ./pgqueprom/...

.PHONY: help deps test test-ts test-versions lint generate demo bench fuzz

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

deps: ## Install the system packages the tests and demo need (PostgreSQL 15, PgQ, pg_cron, PgBouncer) when missing.
	@scripts/install-deps

test: deps ## Vet, then run every test with the race detector, then the TypeScript package's.
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 25m $(PKGS)
	$(MAKE) test-ts

test-ts: deps ## Build the TypeScript package (clients/typescript) and run its tests.
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build && npm test

# The PostgreSQL majors test-versions runs on; CI leaves out 15, which
# `make test` covers in full.
VERSIONS ?= 14 15 16 17 18

test-versions: deps ## Run the SQL suites and the Go library's tests on each PostgreSQL major in VERSIONS (default 14 to 18).
	@scripts/test-versions $(VERSIONS)

lint: ## Check formatting (gofmt), go vet, that every go.mod/go.sum is tidy, that importers get no tool dependencies, that the generated SQL is current and not copied, and that the TypeScript package's SQL is current.
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	@scripts/tidy -check
	@scripts/importcheck
	@scripts/sqlgen-check
	@scripts/tssql

generate: ## Render the generated SQL files (sql/**/*.gen.sql) from sql/templates/.
	$(GO) generate ./sql

demo: deps ## Start a throwaway Postgres and run the multi-tenant workload end to end.
	$(GO) run ./cmd/pgque demo

bench: deps ## Run the benchmarks and print their ratios.
	$(GO) run ./cmd/pgque bench

fuzz: ## Run every fuzz target for FUZZTIME each: a duration (default 30s) or a count of inputs (3000x).
	@for pkg in $$($(GO) list $(PKGS)); do \
		for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
			echo "== $$pkg $$target"; \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
		done; \
	done

.PHONY: screenshots
screenshots: deps ## Regenerate the web console's screenshots in docs/console (needs chromium).
	cd cmd/pgque && PGQUE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console $(GO) test -count=1 -run TestConsoleInBrowser ./internal/web/
