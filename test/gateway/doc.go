// Package gateway runs the Gateway API conformance suite; see
// gateway_test.go.
package gateway
