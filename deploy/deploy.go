// Package deploy holds flatnet's manifests, embedded so that the lab's
// `--install manifest` applies the very file users apply.
package deploy

import _ "embed"

// Manifest is deploy/flatnet.yaml.
//
//go:embed flatnet.yaml
var Manifest []byte
