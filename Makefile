# The two commands of the README: `make lab` (the main job) and `make test` (every test). Both set up first.
.PHONY: setup lab demo test bench

setup:
	sh scripts/setup.sh

lab: setup
	mkdir -p build/lab
	bin/atoll lab run --json build/lab/report.json --svg build/lab/lab.svg

demo: setup
	bin/atoll demo

test: setup
	sh scripts/test.sh

bench: setup
	sh bench/run.sh
