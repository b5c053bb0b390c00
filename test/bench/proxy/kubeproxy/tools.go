//go:build tools

// Package tools pins kube-proxy's main package for hack/bench-proxy.sh; the
// build tag keeps it out of every ordinary build.
package tools

import _ "k8s.io/kubernetes/cmd/kube-proxy"
