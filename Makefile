# A thin layer over cargo and scripts/: CI runs `make test`, as a person does.
.PHONY: build release demo run test test-kernel-relay lint doc bench bench-quick bench-tls compare-c clean

build:
	cargo build

release:
	cargo build --release

# Three demo backends on 127.0.0.1:8001-8003 and the balancer on port 8080.
demo:
	cargo run --release -- demo

# The article's way: asks for the backends, then listens on port 8080.
run:
	cargo run --release

test:
	scripts/test.sh

# The kernel relay's own tests, then the copy pump's tests again with the
# relay on (from the start, then after four exchanges: the list is
# scripts/kernel-relay-pass.sh's, which `make test` runs too); needs root,
# as the relay does.
test-kernel-relay:
	cargo test --test kernel_relay --test kernel_relay_auto
	scripts/kernel-relay-pass.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps

# rodizio beside HAProxy, nginx stream and the naive relay, each process in a
# session of its own: throughput, p50/p99/p99.9, CPU and run-queue wait per
# request, into docs/benchmarks.md and docs/benchmarks.png (about 10 minutes;
# bench-quick about 2, run before and after changes to the data path).
bench:
	scripts/bench.sh

bench-quick:
	scripts/bench.sh --quick

# TLS termination beside HAProxy and nginx with the same certificate:
# handshakes/s, CPU per handshake, bulk MB/s and RSS per TLS connection,
# into bench-out/tls.txt (scripts/bench-tls.sh --quick for a smoke run).
bench-tls:
	scripts/bench-tls.sh

# The article's C beside rodizio, same checks: make compare-c C_DIR=path/to/the/C
# (without C_DIR, rodizio's side only).
compare-c:
	scripts/compare-c.sh $(C_DIR)

clean:
	cargo clean
