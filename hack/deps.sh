#!/usr/bin/env bash
# Installs what flatnet's build, tests and demo need on a Debian machine, as
# root: iproute2, nftables, iptables, conntrack, iperf3, ethtool, curl,
# util-linux (nsenter), debootstrap, and for the cgo builds of
# hack/build-node.sh (runc, containerd) gcc, pkg-config and libseccomp-dev.
# Go modules come through the module proxy when `go` builds. Idempotent: it
# only calls apt when a command is missing.
set -euo pipefail
need=()
command -v ip >/dev/null        || need+=(iproute2)
command -v nft >/dev/null       || need+=(nftables)
command -v iptables >/dev/null  || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v iperf3 >/dev/null    || need+=(iperf3)
command -v ethtool >/dev/null   || need+=(ethtool)
command -v git >/dev/null       || need+=(git)
command -v curl >/dev/null      || need+=(curl)        # make demo: requests from inside pods
command -v nsenter >/dev/null   || need+=(util-linux)  # flatnet lab exec
command -v gcc >/dev/null       || need+=(gcc)
command -v strace >/dev/null    || need+=(strace)  # make bench-cni: processes, netlink and sysctls per plugin
command -v pkg-config >/dev/null || need+=(pkg-config)  # make node: runc finds libseccomp
# make node: runc's seccomp support links Debian's libseccomp.
[ -f /usr/include/seccomp.h ]   || need+=(libseccomp-dev)
command -v debootstrap >/dev/null || need+=(debootstrap)  # make images: the Debian root of the lab's images
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hack/deps.sh: missing ${need[*]}; run as root (or install them) first" >&2
    exit 1
  fi
  echo "hack/deps.sh: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then
    echo "hack/deps.sh: go is at /usr/local/go/bin; add it to PATH" >&2
  else
    echo "hack/deps.sh: no Go toolchain found; install Go 1.26 or newer" >&2
  fi
  exit 1
fi
