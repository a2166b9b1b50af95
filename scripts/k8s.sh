#!/bin/sh
# `make k8s`: the pinned Kubernetes and etcd binaries the tests (and `atoll lab run --kubernetes`) run, built from
# their Go modules through the wrapper module in k8s/ (see its go.mod), into a cache outside the checkout that later
# runs reuse. A set is rebuilt only when the pinned versions (k8s/go.mod, k8s/helm/go.mod) change.
#   sh scripts/k8s.sh [control-plane|all]   control-plane: etcd, kube-apiserver, kubectl, helm (default: all, which
#                                           adds kubelet, kube-scheduler, kube-controller-manager, kube-proxy and
#                                           OpenYurt's yurthub v1.7 from the wrapper module k8s/yurthub, built into a
#                                           sibling folder keyed by its own pins, openyurt-<version>-<pins>, and linked
#                                           into the set's folder as yurthub: a change of the openyurt pin rebuilds
#                                           yurthub alone, a change of the Kubernetes pins does not rebuild it)
#   sh scripts/k8s.sh netpol                Kubernetes' NetworkPolicy conformance tests (k8s/e2e/netpol, built with
#                                           `go test -c` as e2e-netpol) and agnhost, the image they run; only for
#                                           `make netpol` (scripts/netpol-e2e.ts), never for `make test`
#   sh scripts/k8s.sh all v1.37             a second pinned set, only for `sh bench/run.sh kubelet --kubernetes 1.37`:
#                                           the wrapper module k8s/v1.37 (Kubernetes v1.37.2), its kube-apiserver,
#                                           kubectl, kubelet, kube-scheduler and kube-controller-manager (no etcd, helm
#                                           or kube-proxy: the bench runs the default set's etcd); built only on demand
# Prints the binaries' folder on its last line. ATOLL_K8S_CACHE moves the cache (default /var/cache/atoll/k8s).
set -eu
cd "$(dirname "$0")/../k8s"
K8S_VERSION=v1.34.4
set_name=${1:-all}
k8s_set=${2:-}
extra="etcd helm"
case "$set_name" in
  control-plane) cmds="kube-apiserver kubectl" ;;
  all) cmds="kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager kube-proxy" ;;
  netpol) cmds="e2e-netpol agnhost" extra="" ;;
  *) echo "k8s.sh: unknown set '$set_name' (control-plane, all or netpol)" >&2; exit 2 ;;
esac
pin_files="go.mod helm/go.mod"
if [ -n "$k8s_set" ] && [ "$set_name" = netpol ]; then
  echo "k8s.sh: the netpol set is built for the default pinned set only" >&2
  exit 2
fi
if [ -n "$k8s_set" ]; then
  if [ ! -f "$k8s_set/go.mod" ] || [ "$k8s_set" = helm ]; then
    echo "k8s.sh: no pinned set '$k8s_set' (a folder of k8s/ with a go.mod, e.g. v1.37)" >&2
    exit 2
  fi
  cd "$k8s_set"
  K8S_VERSION=$(awk '$1 == "k8s.io/kubernetes" { print $2 }' go.mod)
  cmds=$(echo "$cmds" | sed 's/ kube-proxy//')
  extra=""
  pin_files="go.mod"
fi
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
if ! command -v go >/dev/null 2>&1; then
  echo "k8s.sh: no Go toolchain on PATH: install Go 1.24 or newer (Debian: golang-go from bookworm-backports)" >&2
  exit 1
fi
# the cache is keyed by the pinned versions alone, so editing a comment in go.mod rebuilds nothing
pins=$(grep -hE '^[[:space:]]+(k8s.io/kubernetes|go.etcd.io/etcd/server/v3|helm.sh/helm/v3) v' $pin_files | awk '{print $1 "@" $2}' | sort)
out="${ATOLL_K8S_CACHE:-/var/cache/atoll/k8s}/$K8S_VERSION-$(echo "$pins" | sha256sum | cut -c1-12)"
mkdir -p "$out"
todo=""
for c in $extra $cmds; do [ -x "$out/$c" ] || todo="$todo $c"; done
if [ -n "$todo" ]; then
  echo "k8s.sh: building$todo ($K8S_VERSION, into $out; tens of minutes on 2 cores when the Go caches are cold)" >&2
  start=$(date +%s)
  export CGO_ENABLED=0 GOFLAGS=-mod=mod
  ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ld="$ld -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  ld="$ld -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
  ld="$ld -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1"
  ld="$ld -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for c in $todo; do
    build="build"
    case "$c" in
      etcd) dir=. pkg=go.etcd.io/etcd/server/v3 ;;
      helm) dir=helm pkg=helm.sh/helm/v3/cmd/helm ;;
      e2e-netpol) dir=. pkg=./e2e/netpol build="test -c" ;;
      agnhost) dir=. pkg=k8s.io/kubernetes/test/images/agnhost ;;
      *) dir=. pkg=k8s.io/kubernetes/cmd/$c ;;
    esac
    # shellcheck disable=SC2086 # $build is two words for the test binary
    (cd "$dir" && go $build -trimpath -ldflags "$ld" -o "$out/$c.partial" "$pkg")
    mv "$out/$c.partial" "$out/$c"
  done
  echo "k8s.sh: built$todo in $(( $(date +%s) - start )) s; $(du -sh "$out" | cut -f1) of binaries" >&2
fi
if [ "$set_name" = all ] && [ -z "$k8s_set" ]; then
  # yurthub: its own module and its own key, so neither pin set rebuilds the other's binaries
  yurt_version=$(awk '$1 == "github.com/openyurtio/openyurt" { print $2 }' yurthub/go.mod)
  # the openyurt pin and the replace lines, comments and layout aside
  yurt_pins=$(sed 's|//.*||' yurthub/go.mod | grep -E '=>|^[[:space:]]*(require[[:space:]]+)?github.com/openyurtio/openyurt[[:space:]]' | sed -E 's/^[[:space:]]*(require|replace)?[[:space:]]*//; s/[[:space:]]+/ /g; s/ $//' | sort)
  yurt_key="openyurt-$yurt_version-$(echo "$yurt_pins" | sha256sum | cut -c1-12)"
  yurt_out="$(dirname "$out")/$yurt_key"
  if [ ! -x "$yurt_out/yurthub" ]; then
    echo "k8s.sh: building yurthub (openyurt $yurt_version, into $yurt_out; about 5 minutes on 2 cores when the Go caches are cold)" >&2
    start=$(date +%s)
    mkdir -p "$yurt_out"
    ld="-s -w -X github.com/openyurtio/openyurt/pkg/projectinfo.gitVersion=$yurt_version"
    (cd yurthub && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ld" -o "$yurt_out/yurthub.partial" github.com/openyurtio/openyurt/cmd/yurthub)
    mv "$yurt_out/yurthub.partial" "$yurt_out/yurthub"
    echo "k8s.sh: built yurthub in $(( $(date +%s) - start )) s; $(du -sh "$yurt_out/yurthub" | cut -f1)" >&2
  fi
  ln -sfn "../$yurt_key/yurthub" "$out/yurthub"
fi
echo "$out"
