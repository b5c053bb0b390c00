//go:build tools

// Package tools pins the kwok command hack/build-kwok.sh builds, so that
// go.mod and go.sum list every module it needs. The build tag keeps it out of
// any ordinary build: it is a main package, not an importable one.
package tools

import (
	// kwok plays the kubelet for the lab's simulated nodes
	// (flatnet lab up --simulated-nodes N).
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
