//go:build tools

// Package tools pins crictl (cri-tools) for the lab's real nodes;
// hack/build-node.sh builds it. See ../containerd/tools.go for why each
// program has its own module.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
