# The two commands of the README: `make demo` (the main job) and `make test` (every test). Both set up first.
.PHONY: setup demo test bench

setup:
	sh scripts/setup.sh

demo: setup
	bin/atoll demo

test: setup
	sh scripts/test.sh

bench: setup
	sh bench/run.sh
