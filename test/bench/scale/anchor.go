package main

// The anchor for the agent's CPU per peer event. A process of the
// harness's own that only receives Node events: the agent's client
// settings (kube.Client: protobuf, no compression; one LIST first) and a
// client-go informer whose handlers do nothing. Measured over the same
// window as the agent, its CPU per event is what any client-go consumer
// of Node events pays on this machine, and the agent's figure less it is
// what flatnet's own handling adds.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/flatnet/flatnet/internal/kube"
)

// anchorFlag runs this binary as the anchor (its value: a kubeconfig).
const anchorFlag = "anchor-node-watch"

// runAnchor watches Nodes until SIGTERM, saying "synced" on stdout once
// its cache is.
func runAnchor(kubeconfig string) error {
	c, err := kube.Client(kubeconfig, "flatnet-scalebench-anchor")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	factory := informers.NewSharedInformerFactoryWithOptions(kube.ListFirst(c), 0)
	inf := factory.Core().V1().Nodes().Informer()
	// Handlers that do nothing: every event still goes through the
	// informer's queue to a listener, as the agent's do.
	nothing := func(any) {}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: nothing, DeleteFunc: nothing, UpdateFunc: func(_, cur any) {},
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("node cache never synced")
	}
	fmt.Println("synced")
	<-ctx.Done()
	factory.Shutdown()
	return nil
}

// anchor is a running anchor process.
type anchor struct {
	cmd *exec.Cmd
}

// startAnchor starts the anchor against kubeconfig and waits for its
// cache.
func startAnchor(ctx context.Context, kubeconfig string) (*anchor, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-"+anchorFlag, kubeconfig)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the anchor: %w", err)
	}
	a := &anchor{cmd: cmd}
	synced := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		switch {
		case err != nil:
			err = fmt.Errorf("the anchor (a bare Node watch against %s) ended before its cache synced; its error is above: %w", kubeconfig, err)
		case strings.TrimSpace(line) != "synced":
			err = fmt.Errorf("the anchor said %q, not \"synced\"", line)
		}
		synced <- err
	}()
	select {
	case err = <-synced:
	case <-time.After(2 * time.Minute):
		err = errors.New("anchor's node cache not synced in 2 minutes")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		a.stop()
		return nil, err
	}
	return a, nil
}

func (a *anchor) usage() (usage, error) { return readUsage(a.cmd.Process.Pid) }

// stop ends the anchor (its own child, by PID) and reaps it.
func (a *anchor) stop() {
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = a.cmd.Process.Kill()
		<-done
	}
}
