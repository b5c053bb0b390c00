//go:build tools

// Package tools pins runc for the lab's real nodes; hack/build-node.sh builds
// it with cgo and the tags "seccomp urfave_cli_no_docs" (not the default
// libpathrs, which needs a Rust C library Debian does not ship). See
// ../containerd/tools.go for why each program has its own module.
package tools

import _ "github.com/opencontainers/runc"
