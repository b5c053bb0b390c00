package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/flatnet/flatnet/internal/lab/runtime/process"
	"github.com/flatnet/flatnet/internal/proc"
)

// ExitError carries a command's exit code through `lab exec` and
// `lab kubectl` (cli.ExitCode reads it through ExitCode()).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// ExitCode is the exit code to pass on.
func (e *ExitError) ExitCode() int { return e.Code }

// runPassthrough runs cmd with the caller's stdio and turns its exit
// status into an *ExitError.
func runPassthrough(cmd *exec.Cmd) error {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal()) // as a shell reports it
		}
		return &ExitError{Code: code}
	}
	return err
}

// Kubectl runs the lab's kubectl with args against lab name.
func Kubectl(root, name string, args []string) error {
	rec, err := loadRecord(root, name)
	if err != nil {
		return err
	}
	kubectl := filepath.Join(rec.K8sBinDir, "kubectl")
	if !fileExists(kubectl) {
		return fmt.Errorf("%s not found: run `make k8s`", kubectl)
	}
	if !fileExists(rec.Kubeconfig()) {
		return fmt.Errorf("lab %s has no kubeconfig yet (%s): run `flatnet lab up%s`", name, rec.Kubeconfig(), nameFlag(name))
	}
	cmd := exec.Command(kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+rec.Kubeconfig())
	return runPassthrough(cmd)
}

// ExecKubectl runs argv in a container of a pod on a real node (the
// containerd runtime) with `kubectl exec -i`; its exit code passes
// through.
func ExecKubectl(root, name, namespace, pod, container string, argv []string) error {
	if err := ValidatePodRef(namespace, pod, container); err != nil {
		return err
	}
	args := []string{"exec", "-i", "-n", namespace, pod}
	if container != "" {
		args = append(args, "-c", container)
	}
	return Kubectl(root, name, append(append(args, "--"), argv...))
}

// Kubeconfig returns lab name's admin kubeconfig path.
func Kubeconfig(root, name string) (string, error) {
	rec, err := loadRecord(root, name)
	if err != nil {
		return "", err
	}
	if !fileExists(rec.Kubeconfig()) {
		return "", fmt.Errorf("lab %s has no kubeconfig yet (%s): run `flatnet lab up%s`", name, rec.Kubeconfig(), nameFlag(name))
	}
	return rec.Kubeconfig(), nil
}

// ExecTarget is where `lab exec` runs: a container's process.
type ExecTarget struct {
	Node      string
	Container string
	PID       int
}

// FindContainer finds the process of container (empty: the pod's default
// container) of pod namespace/pod in lab name. It asks the API where the
// pod runs and falls back to the nodes' runtime state when the API does
// not answer.
func FindContainer(ctx context.Context, root, name, namespace, pod, container string) (*ExecTarget, error) {
	if err := ValidatePodRef(namespace, pod, container); err != nil {
		return nil, err
	}
	rec, err := loadRecord(root, name)
	if err != nil {
		return nil, err
	}
	s := &rec.Spec
	var node string
	if c, _, err := Client(s.Kubeconfig()); err == nil {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err := c.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		cancel()
		if err == nil {
			node = p.Spec.NodeName
			if node == "" {
				return nil, fmt.Errorf("pod %s/%s is not scheduled to a node yet", namespace, pod)
			}
			if container == "" {
				container = p.Annotations["kubectl.kubernetes.io/default-container"]
			}
			if container == "" && len(p.Spec.Containers) > 0 {
				container = p.Spec.Containers[0].Name
			}
		}
	}
	podDir := namespace + "_" + pod
	var candidates []Node
	if node != "" {
		n, ok := s.Node(node)
		if !ok {
			return nil, fmt.Errorf("pod %s/%s runs on %s, which is not a node of lab %s", namespace, pod, node, name)
		}
		candidates = []Node{n}
	} else {
		candidates = s.Nodes
	}
	for _, n := range candidates {
		dir := filepath.Join(s.RuntimeDir(n), "pods", podDir)
		if !fileExists(dir) {
			continue
		}
		pid, err := process.ContainerPID(s.RuntimeDir(n), namespace, pod, container)
		if err != nil {
			return nil, err
		}
		return &ExecTarget{Node: n.Name, Container: container, PID: pid}, nil
	}
	if node != "" {
		return nil, fmt.Errorf("pod %s/%s is bound to %s but its runtime has not started it yet", namespace, pod, node)
	}
	return nil, fmt.Errorf("no pod %s/%s in lab %s", namespace, pod, name)
}

// ValidatePodRef checks the names `lab exec` was given as the API server
// would (a namespace and a container are RFC 1123 labels, a pod an RFC 1123
// subdomain; container "" means the default one) before they become parts
// of runtime paths: "../x" or "a/b" must not reach another directory.
func ValidatePodRef(namespace, pod, container string) error {
	var errs []error
	check := func(what, v string, rules func(string) []string) {
		if msgs := rules(v); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("invalid %s name %q: %s", what, v, strings.Join(msgs, "; ")))
		}
	}
	check("namespace", namespace, validation.IsDNS1123Label)
	check("pod", pod, validation.IsDNS1123Subdomain)
	if container != "" {
		check("container", container, validation.IsDNS1123Label)
	}
	return errors.Join(errs...)
}

// Exec runs argv inside a container's network, mount and UTS namespaces
// (nsenter from util-linux) with the container's environment, and passes
// its exit code on.
func Exec(t *ExecTarget, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command: flatnet lab exec POD -- CMD [ARGS...]")
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("nsenter (util-linux) not found: %w", err)
	}
	// Only stdin, stdout and stderr go into the pod, as with docker exec:
	// not what this process inherited from its caller.
	if err := proc.CloseOnExecFrom(3); err != nil {
		return err
	}
	cmd := exec.Command(nsenter, append([]string{"-t", strconv.Itoa(t.PID), "-n", "-m", "-u", "--"}, argv...)...)
	// The container's environment (its PATH finds flatnet), as kubectl
	// exec gives; nsenter itself is found above, so PATH may change.
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(t.PID) + "/environ"); err == nil && len(b) > 0 {
		cmd.Env = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	return runPassthrough(cmd)
}
