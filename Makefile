# The two commands of the README: `make lab` (the main job) and `make test` (every test). Both set up first.
.PHONY: setup lab demo test bench k8s image netpol

setup:
	sh scripts/setup.sh

lab: setup
	mkdir -p build/lab
	bin/atoll lab run --json build/lab/report.json --svg build/lab/lab.svg

demo: setup
	bin/atoll demo

test: setup
	sh scripts/test.sh

# Kubernetes v1.34 (kube-apiserver, kubelet, ...), etcd 3.6, helm and OpenYurt's yurthub v1.7, built from their Go
# modules into /var/cache/atoll/k8s (minutes the first time; `make test` runs it; `make lab` does not need it)
k8s:
	sh scripts/k8s.sh all

# The Atoll image as a docker-archive tarball (build/image/), for `ctr -n k8s.io images import`
image: setup
	node_modules/.bin/node scripts/image.ts

bench: setup
	sh bench/run.sh

# Kubernetes' own NetworkPolicy conformance tests (the [sig-network] Netpol suite, built from the pinned module with
# agnhost, the image it runs) against a Kubernetes lab whose agents enforce NetworkPolicy; opt-in, 20 to 30 minutes
netpol: image k8s
	node_modules/.bin/node scripts/netpol-e2e.ts
