package testutil

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSkipHelperChild is run by TestSkipFailsInCI in a child process: it
// only skips through Skip.
func TestSkipHelperChild(t *testing.T) {
	if os.Getenv("FLATNET_SKIP_CHILD") != "1" {
		return
	}
	Skip(t, "the child's reason")
}

// TestSkipFailsInCI: the same Skip call skips outside CI and fails the
// test under CI=true, so CI cannot pass by skipping.
func TestSkipFailsInCI(t *testing.T) {
	for _, c := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP: TestSkipHelperChild"},
		{"true", true, "--- FAIL: TestSkipHelperChild"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipHelperChild$", "-test.v")
		cmd.Env = append(os.Environ(), "FLATNET_SKIP_CHILD=1", "CI="+c.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != c.wantFail || !strings.Contains(string(out), c.want) ||
			!strings.Contains(string(out), "the child's reason") {
			t.Errorf("CI=%q: err %v, want failure %v and %q with the reason:\n%s", c.ci, err, c.wantFail, c.want, out)
		}
	}
}

// TestNoDirectSkips: every skip in the module's tests goes through Skip
// (which fails under CI); only benchmarks, which `make test` does not run,
// may call b.Skip themselves.
func TestNoDirectSkips(t *testing.T) {
	root := moduleRoot()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || fileExists(filepath.Join(path, "go.mod"))) {
			return filepath.SkipDir // other modules (hack/k8s), testdata, .git
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || strings.HasPrefix(fn.Name.Name, "Benchmark") || (fn.Name.Name == "Skip" && f.Name.Name == "testutil") {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					if m := sel.Sel.Name; m == "Skip" || m == "Skipf" || m == "SkipNow" {
						if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "testutil" {
							t.Errorf("%s: %s calls %s directly; use testutil.Skip (it fails under CI=true)", fset.Position(call.Pos()), fn.Name.Name, m)
						}
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
