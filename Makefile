# idemgate — hand-written Makefile (Redis-style): -MMD dependencies, a SANITIZER knob.
#
#   make            build/idemgate and build/idemgate-mock
#   make asan       the same with ASan+UBSan, into build-asan/
#   make run        install what running needs, build, start PostgreSQL + mock + gateway
#                   (CONFIG=file PORT=n: your own configuration, another port)
#   make test       install what is missing, build, unit tests (cmocka) + integration (pytest)
#   make chaos      the full fault matrix;  make bench: the side-by-side benchmark
#   make fuzz       each libFuzzer harness for FUZZ_SECONDS, then the differential checks

BUILD     ?= build
ifeq ($(origin CC),default)
CC        := gcc
endif
OPT       ?= -O2
PKGS      := libmicrohttpd libcurl libcjson libpq openssl
WARN      := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Werror
CFLAGS    += -std=c11 -D_GNU_SOURCE -g $(OPT) $(WARN) -Iinclude -MMD -MP
LDLIBS    += -lpthread -lm

ifneq ($(SANITIZER),)
CFLAGS    += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer
LDFLAGS   += -fsanitize=$(SANITIZER)
endif
ifeq ($(CRASHPOINTS),1)
CFLAGS    += -DIG_CRASHPOINTS=1
endif
# The fuzz build (see fuzz-build): undefined behaviour stops the run, so libFuzzer records it.
ifeq ($(FUZZING),1)
CFLAGS    += -fno-sanitize-recover=all
endif

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

SRCS      := $(wildcard src/*.c)
MIGRATIONS:= $(sort $(wildcard migrations/*.sql))
CONSOLE   := $(sort $(wildcard console/*.html console/*.css console/*.js console/*.svg))
# The console's charting library, from npm (console/package.json, pinned by its lock file).
CONSOLE_LIBS := console/node_modules/uplot/dist/uPlot.iife.min.js \
	console/node_modules/uplot/dist/uPlot.min.css
OBJS      := $(SRCS:%.c=$(BUILD)/%.o) $(BUILD)/gen/migrations.o $(BUILD)/gen/console.o
LIB_OBJS  := $(filter-out $(BUILD)/src/main.o,$(OBJS))
MOCK_SRCS := $(wildcard tests/mock/*.c)
MOCK_OBJS := $(MOCK_SRCS:%.c=$(BUILD)/%.o)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
# libFuzzer harnesses (one per parser that sees outside bytes) and the differential tools, built
# with clang into their own folder; seed corpora in tests/fuzz/corpus/<harness>/.
FUZZ_BUILD   ?= build-libfuzzer
FUZZ_CC      ?= clang
FUZZ_JOBS    ?= 2
FUZZ_SECONDS ?= 120
FUZZ_SHORT_SECONDS ?= 1
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZ_TOOL_SRCS := $(wildcard tests/fuzz/tool_*.c)
FUZZ_TOOLS := $(FUZZ_TOOL_SRCS:tests/fuzz/%.c=$(BUILD)/fuzz/%)

PYTHON    ?= /usr/bin/python3
# Parallel compile jobs for the builds `make test` and `make chaos` start.
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
# Processes the integration tests run on (pytest-xdist, a test file per process at a time: each
# has its own PostgreSQL cluster and mock; 0: one process, as before).
TEST_WORKERS ?= 3

.PHONY: all asan deps deps-run run test unit pyunit integration chaos test-citus bench bench-citus clean format fuzz fuzz-build \
	fuzz-bins fuzz-regress fuzz-diff
all: $(BUILD)/idemgate $(BUILD)/idemgate-mock

$(BUILD)/idemgate: $(OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) $(LDLIBS)

$(BUILD)/idemgate-mock: $(MOCK_OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) $(LDLIBS)

# The list of migration files, rewritten only when it changes: a migration renamed or removed
# (its mtime unchanged) still regenerates the embedded set.
MIGRATIONS_LIST := $(BUILD)/gen/migrations.list
$(shell mkdir -p $(BUILD)/gen && (echo '$(MIGRATIONS)' | cmp -s - $(MIGRATIONS_LIST) || \
	echo '$(MIGRATIONS)' > $(MIGRATIONS_LIST)))

$(BUILD)/gen/migrations.c: $(MIGRATIONS) $(MIGRATIONS_LIST) scripts/embed_migrations.sh
	@mkdir -p $(dir $@)
	scripts/embed_migrations.sh $(MIGRATIONS) > $@

$(BUILD)/gen/migrations.o: $(BUILD)/gen/migrations.c
	$(CC) $(CFLAGS) -c -o $@ $<

# The operator console's files and its libraries, embedded byte for byte (src/console.c serves
# them). The libraries are installed from npm when missing or when the lock file changed.
console/node_modules/.installed: console/package.json console/package-lock.json scripts/npm-tools.sh
	@rm -f $@
	scripts/npm-tools.sh console

$(CONSOLE_LIBS): console/node_modules/.installed
	@test -f $@ || { echo "$@ missing after npm ci" >&2; exit 1; }

$(BUILD)/gen/console.c: $(CONSOLE) $(CONSOLE_LIBS) scripts/embed_console.sh
	@mkdir -p $(dir $@)
	scripts/embed_console.sh $(CONSOLE) $(CONSOLE_LIBS) > $@

$(BUILD)/gen/console.o: $(BUILD)/gen/console.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -c -o $@ $<

# The commit the build is made from, for idemgate_build_info (empty outside a git checkout): the
# file is rewritten only when the commit changes, and metrics.o is rebuilt with it.
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null)
$(shell mkdir -p $(BUILD)/gen && (echo '$(GIT_COMMIT)' | cmp -s - $(BUILD)/gen/git_commit || \
	echo '$(GIT_COMMIT)' > $(BUILD)/gen/git_commit))
$(BUILD)/src/metrics.o: $(BUILD)/gen/git_commit
$(BUILD)/src/metrics.o: CFLAGS += -DIG_GIT_COMMIT='"$(GIT_COMMIT)"'

# Each unit test links the library objects (everything but main.c) and cmocka.
$(BUILD)/tests/test_%: $(BUILD)/tests/unit/test_%.o $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) -lcmocka $(LDLIBS)

# Harnesses link the library objects (everything but main.c), instrumented for coverage.
$(BUILD)/tests/fuzz/%.o: CFLAGS += -DIG_FUZZ_PROFILES='"$(CURDIR)/deploy/providers"'
$(BUILD)/fuzz/fuzz_%: $(BUILD)/tests/fuzz/fuzz_%.o $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(PKG_LIBS) $(LDLIBS)

$(BUILD)/fuzz/tool_%: $(BUILD)/tests/fuzz/tool_%.o $(LIB_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) $(LDLIBS)

.PRECIOUS: $(BUILD)/tests/fuzz/%.o
fuzz-bins: $(FUZZ_BINS) $(FUZZ_TOOLS)

asan:
	$(MAKE) BUILD=build-asan SANITIZER=address,undefined OPT=-O1 all

# Debian packages, only those missing: `deps-run` what building and running needs (make run),
# `deps` that and every test tool (make test, chaos, fuzz, bench). scripts/deps.sh lists both.
deps:
	@scripts/deps.sh test

deps-run:
	@scripts/deps.sh run

# make run [CONFIG=file] [PORT=n]: the example configuration (or your own) on 127.0.0.1:PORT.
# scripts/run.sh also reads MOCK_PORT, RUN_DIR, PGDATA_DIR, PG_PORT and DATABASE_URL.
run: deps-run
	@$(MAKE) --no-print-directory all
	@CONFIG='$(CONFIG)' PORT='$(PORT)' scripts/run.sh

# A locale whose decimal point is a comma proves number handling ignores the locale (test_jcs).
$(BUILD)/locale/de_DE.UTF-8/LC_NUMERIC:
	@mkdir -p $(BUILD)/locale
	localedef -i de_DE -f UTF-8 $(BUILD)/locale/de_DE.UTF-8

unit: $(UNIT_BINS) $(BUILD)/locale/de_DE.UTF-8/LC_NUMERIC
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; LOCPATH=$(BUILD)/locale $$t; done

# The Python client's decisions (retry policy, keys, errors, the batch runner's bookkeeping):
# pure unit tests, no gateway needed.
pyunit:
	$(PYTHON) -m pytest -q -p no:cacheprovider clients/python/tests

# Integration tests build a crash-point-enabled gateway of their own (build-test/).
integration: all
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build-test CRASHPOINTS=1 all
	$(PYTHON) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile tests/integration \
		$(PYTEST_ARGS)

test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory -j$(JOBS) unit
	@$(MAKE) --no-print-directory pyunit
	@$(MAKE) --no-print-directory fuzz-regress
	@PYTHON=$(PYTHON) scripts/check-monitoring.sh
	@$(MAKE) --no-print-directory integration

# clang + libFuzzer + ASan + UBSan, every object of the library instrumented for coverage.
fuzz-build:
	@$(MAKE) --no-print-directory -j$(FUZZ_JOBS) BUILD=$(FUZZ_BUILD) CC=$(FUZZ_CC) OPT=-O1 \
		SANITIZER=fuzzer-no-link,address,undefined FUZZING=1 fuzz-bins

# Every checked-in corpus replayed (no fuzzing), then FUZZ_SHORT_SECONDS of fuzzing per harness.
fuzz-regress: fuzz-build
	@scripts/fuzz.sh regress $(FUZZ_BUILD) $(FUZZ_SHORT_SECONDS)

# Each harness for FUZZ_SECONDS, then the differential checks against reference implementations.
fuzz: deps
	@$(MAKE) --no-print-directory fuzz-build
	@scripts/fuzz.sh run $(FUZZ_BUILD) $(FUZZ_SECONDS)
	@$(MAKE) --no-print-directory fuzz-diff

fuzz-diff: fuzz-build
	@scripts/fuzz-diff.sh $(FUZZ_BUILD)

# The whole fault matrix at full size (make test runs a CI-sized subset of every scenario).
chaos: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build-test CRASHPOINTS=1 all
	CHAOS_FULL=1 $(PYTHON) -m pytest -q -s tests/integration/test_chaos*.py \
		tests/integration/test_failover.py $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-image

# The container image built from docker/Dockerfile and run with podman (read-only root, non-root,
# healthcheck, two replicas on one PostgreSQL, SIGTERM): minutes, so not part of `make test`.
# scripts/image-deps.sh installs podman, runc and debootstrap; the Debian base is debootstrapped
# once and cached (.cache/image/ and podman's storage). Needs root.
.PHONY: test-image
test-image: deps
	@scripts/image-deps.sh
	IDEMGATE_TEST_IMAGE=1 $(PYTHON) -m pytest -q -p no:cacheprovider --durations=0 \
		tests/integration/test_image.py $(PYTEST_ARGS)

# The integration tests that use the suite's shared database, against a Citus coordinator
# (CITUS_DATABASE_URL: a superuser URL of a coordinator with its workers added; the suite makes
# its own database there and distributes the schema with `idemgate migrate --citus`). The
# project never builds nor downloads Citus: without the variable this target says so and runs
# nothing. deploy/SCALING.md says what runs on Citus today.
CITUS_TESTS ?= tests/integration/test_intake.py tests/integration/test_wait.py \
	tests/integration/test_tenant_isolation.py tests/integration/test_ledger.py \
	tests/integration/test_async.py tests/integration/test_cache.py \
	tests/integration/test_citus_plans.py
test-citus:
ifeq ($(strip $(CITUS_DATABASE_URL)),)
	@echo "test-citus: SKIPPED, nothing was run: CITUS_DATABASE_URL is not set (a superuser URL of a Citus coordinator with its workers added)"
else
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory -j$(JOBS) BUILD=build-test CRASHPOINTS=1 all
	$(PYTHON) -m pytest -q $(CITUS_TESTS) $(PYTEST_ARGS)
endif

# A side-by-side benchmark; it reports and never fails the build.
bench: deps
	@$(MAKE) --no-print-directory all
	bench/run.sh

# On a Citus cluster (CITUS_DATABASE_URL, as for test-citus): intake and end-to-end throughput
# with 1 … N workers, spread over tenants and from one hot tenant (deploy/SCALING.md).
bench-citus:
	@$(MAKE) --no-print-directory all
	$(PYTHON) bench/citus.py

format:
	clang-format -i src/*.c include/idemgate/*.h tests/mock/*.c tests/unit/*.c

clean:
	rm -rf build build-asan build-test $(FUZZ_BUILD)

-include $(OBJS:.o=.d) $(MOCK_OBJS:.o=.d) $(UNIT_SRCS:%.c=$(BUILD)/%.d) \
	$(FUZZ_SRCS:%.c=$(BUILD)/%.d) $(FUZZ_TOOL_SRCS:%.c=$(BUILD)/%.d)
