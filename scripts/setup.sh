#!/bin/sh
# Set-up for a fresh Debian 12 machine, as root: system packages, the project's own Node (>= 22, from the npm
# registry), npm dependencies, the native atoll-cni shim and delay line, and the datagram path's library
# (bin/libatoll-dp.so, on the OpenSSL inside Node). Idempotent; fast when everything is in place.
set -eu
cd "$(dirname "$0")/.."

APT_PACKAGES="iproute2 nftables iptables iputils-ping util-linux gcc libc6-dev libssl-dev make time iperf3 ethtool openssl etcd-server etcd-client \
containerd runc containernetworking-plugins busybox-static prometheus curl conntrack libfaketime fiu-utils"

missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "setup: npm is missing; installing Debian's nodejs and npm to bootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

if [ ! -x node_modules/.bin/node ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "setup: installing npm dependencies (this provides Node 24 in node_modules/.bin/node)"
  npm ci --no-audit --no-fund --loglevel=error
fi

for tool in atoll-cni atoll-delay atoll-keeper; do
  if [ ! -x "bin/$tool" ] || [ "native/$tool.c" -nt "bin/$tool" ] || [ native/keeper-protocol.h -nt "bin/$tool" ]; then
    echo "setup: building bin/$tool"
    cc -O2 -Wall -Wextra -Werror -o "bin/$tool" "native/$tool.c"
  fi
done
# the datagram path's per-datagram work (src/adapters/tunnel/datagram-native.ts loads it); only its own symbols exported. Its
# EVP calls are left undefined and bind, when Node loads it, to the OpenSSL inside Node (3.5, exported for addons):
# 2.4 times faster per datagram here than the system's 3.0 (docs/architecture.md); libssl-dev gives the headers.
# The relay's circuits are joined in the same library (native/atoll-splice.c, src/adapters/tunnel/splice-native.ts).
if [ ! -f bin/libatoll-dp.so ] || [ native/atoll-dp.c -nt bin/libatoll-dp.so ] || [ native/atoll-splice.c -nt bin/libatoll-dp.so ] || [ native/keeper-protocol.h -nt bin/libatoll-dp.so ]; then
  echo "setup: building bin/libatoll-dp.so"
  cc -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden -pthread -o bin/libatoll-dp.so native/atoll-dp.c native/atoll-splice.c
fi
sh scripts/build.sh
echo "setup: ready ($(node_modules/.bin/node --version))"
