package lab

import (
	"fmt"
	"io"

	"github.com/flatnet/flatnet/internal/dirlock"
)

// lockRoot takes an exclusive lock on the state root for one up or down:
// two new labs must not pick the same underlay, and an up must not race a
// down of the same lab.
func lockRoot(root string, out io.Writer) (unlock func(), err error) {
	return dirlock.Lock(root, func() {
		fmt.Fprintf(out, "waiting for another `flatnet lab up` or `down` on %s to finish\n", root)
	})
}
