//go:build tools

// Package tools pins containerd for the lab's real nodes (flatnet lab up
// --runtime containerd): the daemon, its runc shim and ctr, which
// hack/build-node.sh builds into a cache outside git. Nothing here is
// imported by flatnet; the build tag keeps this file out of every ordinary
// build. Each program has a module of its own under hack/node so that it
// builds with exactly the dependency versions its upstream release pins (one
// shared module graph raised runc's x/sys, selinux and logrus, and crictl's
// containerd/log and ttrpc).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
