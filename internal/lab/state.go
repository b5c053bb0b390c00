package lab

// The state dir records the Spec a lab was started with (lab.json), so
// later commands (status, down, a second up) work from the same names and
// ranges even when flags differ or the lab is half gone.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"

	"github.com/flatnet/flatnet/internal/atomicfile"
)

// record is lab.json: the Spec and where the upstream binaries are.
type record struct {
	Spec
	K8sBinDir string `json:"k8sBinDir"`
}

// ErrNoLab is returned (wrapped) when a lab has no state dir.
var ErrNoLab = errors.New("no such lab")

func specFile(root, name string) string { return filepath.Join(root, name, "lab.json") }

// loadRecord reads lab name's lab.json.
func loadRecord(root, name string) (*record, error) {
	b, err := os.ReadFile(specFile(root, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w %q (no %s; start it with `flatnet lab up --name %s`)", ErrNoLab, name, specFile(root, name), name)
	}
	if err != nil {
		return nil, err
	}
	r, err := parseRecord(b, name)
	if err != nil {
		return nil, fmt.Errorf("%w %s (%d bytes): %w (`flatnet lab up --name %s` rebuilds it from the running lab; `flatnet lab down --name %s` removes the lab)",
			ErrBadRecord, specFile(root, name), len(b), err, name, name)
	}
	return r, nil
}

// parseRecord decodes lab.json and checks that it describes a usable lab
// called name: later commands derive names, paths and kernel objects from
// it.
func parseRecord(b []byte, name string) (*record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Name != name || len(r.Nodes) == 0 {
		return nil, fmt.Errorf("it describes lab %q with %d nodes; expected lab %q", r.Name, len(r.Nodes), name)
	}
	// Rebuild the Spec from its options: a record edited by hand (or
	// corrupted) cannot name interfaces, namespaces or paths of another lab.
	want, err := NewSpec(r.Spec.Options(), r.Underlays()...)
	if err != nil {
		return nil, err
	}
	// The pod CIDRs are learned, not derived (hostRoutes routes only those
	// of the lab's nodes inside its cluster CIDR).
	want.PodCIDRs = r.PodCIDRs
	// A record from before --cni-conflist has none (its agents write the
	// classic chain, AgentCNIConflist); NewSpec gives every new lab one.
	if r.CNIConflist == "" {
		want.CNIConflist = ""
	}
	if filepath.Base(r.StateDir) != name || !filepath.IsAbs(r.StateDir) {
		return nil, fmt.Errorf("state dir %q is not an absolute path ending in %q", r.StateDir, name)
	}
	if !reflect.DeepEqual(*want, r.Spec) {
		return nil, fmt.Errorf("its names and addresses do not follow from its options (edited by hand?)")
	}
	return &r, nil
}

// saveRecord writes lab.json atomically.
func saveRecord(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.StateDir, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(r.SpecFile(), append(b, '\n'), 0o644)
}

// otherRanges returns the ranges the root namespace routes for every lab
// under root except name, its underlays and its cluster CIDR: a stopped
// lab keeps them until `down`.
func otherRanges(root, name string) []netip.Prefix {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, e := range ents {
		if !e.IsDir() || e.Name() == name {
			continue
		}
		if r, err := loadRecord(root, e.Name()); err == nil {
			out = append(out, r.Underlays()...)
			out = append(out, r.ClusterCIDR)
		}
	}
	return out
}

// Labs lists the names of the labs under root.
func Labs(root string) []string {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(specFile(root, e.Name())); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// LoadSpec returns the Spec recorded for lab name under root.
func LoadSpec(root, name string) (*Spec, error) {
	if root == "" {
		root = DefaultStateRoot
	}
	r, err := loadRecord(root, name)
	if err != nil {
		return nil, err
	}
	return &r.Spec, nil
}
