#!/bin/sh
# The benchmarks (bench/README.md), as root with the project's own Node:
#   sh bench/run.sh [cni] [options]      CNI ADD/DEL latency and peak RSS, ours against bridge + host-local (the default)
#                                        (--policy: our agent with NetworkPolicy on against off, issue #35)
#   sh bench/run.sh controller [options] controller registrations and block allocations per store, controller and
#                                        agent memory
#   sh bench/run.sh cloud-peers [options] a cloud agent given N edge peers (from its saved state): routes in the kernel,
#                                        RSS, idle CPU at 1k/10k/100k, against one ip -batch of the same routes (#34)
#   sh bench/run.sh overlay [options]    overlay peer programming (Overlay.sync against one ip/bridge process per entry)
#                                        and pod-to-pod iperf3 over our VXLAN against a flannel-style one
#   sh bench/run.sh tunnel [options]     cross-site tunnel throughput on the lab: direct and relayed against kernel
#                                        VXLAN, unshaped and on shaped uplinks; the agents' CPU and RSS under load
#   sh bench/run.sh kubelet [options]    pods through a real kubelet on one node: create-to-Running and a Deployment
#                                        0 -> 30 Ready, Atoll's CNI against bridge + host-local; the agent's idle RSS
#   sh bench/run.sh circuits [options]   the relay's circuits at scale: 1000 open, 16 busy, joined in the kernel against
#                                        Node's stream piping; threads, memory and CPU per Gbit/s (no root needed)
#   sh bench/run.sh watch-view [options] what each agent receives from the controller's watch stream: bytes to join, per
#                                        change elsewhere and nearby, delay; edge and cloud nodes and the relay (no root)
#   sh bench/run.sh policy [options]     NetworkPolicy: 1,000 policies and 10,000 pods compiled, rendered and applied;
#                                        pod-to-pod iperf3 under that ruleset against none
#   sh bench/run.sh policy-propagation   NetworkPolicy changes on the Kubernetes lab: from kubectl apply to in force on
#                                        every node (make k8s and make image first)
# Options pass through (--smoke, --json FILE, ...; --help lists them).
set -eu
cd "$(dirname "$0")/.."
case "${1:-}" in
  controller) shift; exec node_modules/.bin/node bench/controller.ts "$@" ;;
  cloud-peers) shift; exec node_modules/.bin/node bench/cloud-peers.ts "$@" ;;
  overlay) shift; exec node_modules/.bin/node bench/overlay.ts "$@" ;;
  tunnel) shift; exec node_modules/.bin/node bench/tunnel.ts "$@" ;;
  kubelet) shift; exec node_modules/.bin/node bench/kubelet.ts "$@" ;;
  circuits) shift; exec node_modules/.bin/node bench/circuits.ts "$@" ;;
  watch-view) shift; exec node_modules/.bin/node bench/watch-view.ts "$@" ;;
  policy) shift; exec node_modules/.bin/node bench/policy.ts "$@" ;;
  policy-propagation) shift; exec node_modules/.bin/node bench/policy-propagation.ts "$@" ;;
  cni) shift ;;
esac
exec node_modules/.bin/node bench/cni-latency.ts "$@"
