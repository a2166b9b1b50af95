#!/bin/sh
# The pinned containerd 2.x (containerd and containerd-shim-runc-v2) that `sh bench/run.sh kubelet --evented-pleg`
# runs a node on: containerd 1.6 (Debian's, everything else here) sends no CRI container events, which the kubelet's
# evented PLEG needs (bench/README.md, "Evented PLEG"). Built from the Go module proxy with `go install pkg@version`
# (containerd's go.mod has no replace directives) into a cache outside the checkout that later runs reuse; built
# only on demand: neither `make lab` nor `make test` nor CI calls this.
#   sh scripts/containerd2.sh     prints the binaries' folder on its last line
# ATOLL_CONTAINERD2_CACHE moves the cache (default /var/cache/atoll/containerd). About a minute with warm Go caches.
#
# CGO_ENABLED=0 as containerd's own shim build: nothing the CRI path uses here needs cgo (the btrfs snapshotter is cgo
# only, and disabled; seccomp profiles are generated in Go, and runc, Debian's, applies them with libseccomp).
set -eu
VERSION=v2.2.9
out="${ATOLL_CONTAINERD2_CACHE:-/var/cache/atoll/containerd}/$VERSION"
if [ -x "$out/containerd" ] && [ -x "$out/containerd-shim-runc-v2" ]; then echo "$out"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
  echo "containerd2.sh: no Go toolchain on PATH: install Go 1.25 or newer" >&2
  exit 1
fi
echo "containerd2.sh: building containerd $VERSION into $out" >&2
start=$(date +%s)
tmp="$out.partial"
rm -rf "$tmp"
mkdir -p "$tmp"
# go install pkg@version builds outside any module: run it from a neutral directory
cd /
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOBIN="$tmp"
ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$VERSION"
go install -trimpath -tags "no_btrfs urfave_cli_no_docs" -ldflags "$ld" "github.com/containerd/containerd/v2/cmd/containerd@$VERSION"
go install -trimpath -tags "no_btrfs urfave_cli_no_docs no_grpc" -ldflags "$ld" "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$VERSION"
rm -rf "$out"
mv "$tmp" "$out"
echo "containerd2.sh: built in $(( $(date +%s) - start )) s" >&2
echo "$out"
