//go:build tools

// Package tools pins the programs hack/build-k8s.sh builds, so that go.mod
// and go.sum list every module they need. The build tag keeps it out of any
// ordinary build: these are main packages, not importable ones.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"

	// The etcd binary: the module root is its main package.
	_ "go.etcd.io/etcd/server/v3"
)
