package main

// Anchors: processes of the harness's own that only receive events, with
// client-go informers whose handlers do nothing. Measured over the same
// window as a flatnet process, an anchor's CPU per event is what any
// client-go consumer of those events pays on this machine, and the
// flatnet process's figure less it is what flatnet's own handling (and,
// for the controller, its writes) adds.
//
//   - The agent's (peer-churn phase): Nodes, with the agent's client
//     settings (kube.Client: protobuf, no compression; one LIST first).
//   - The EndpointSlice controller's (objects phase onward): Pods,
//     Services, Nodes and EndpointSlices, the informers the controller
//     runs, with its client settings (kube.Client, a WatchList stream
//     first) and no transform. It writes nothing, so the controller's
//     slice writes (one per pod start, as upstream's) are in the
//     controller's figure only.

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

// The flags that run this binary as an anchor (their value: a
// kubeconfig).
const (
	anchorFlag           = "anchor-node-watch"
	controllerAnchorFlag = "anchor-controller-watch"
)

// runAnchor watches what the anchor named by flag watches until SIGTERM,
// saying "synced" on stdout once its caches are.
func runAnchor(flag, kubeconfig string) error {
	c, err := kube.Client(kubeconfig, "flatnet-scalebench-"+flag)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var factory informers.SharedInformerFactory
	var infs []cache.SharedIndexInformer
	switch flag {
	case anchorFlag:
		factory = informers.NewSharedInformerFactoryWithOptions(kube.ListFirst(c), 0)
		infs = []cache.SharedIndexInformer{factory.Core().V1().Nodes().Informer()}
	case controllerAnchorFlag:
		factory = informers.NewSharedInformerFactoryWithOptions(c, 0)
		infs = []cache.SharedIndexInformer{
			factory.Core().V1().Pods().Informer(), factory.Core().V1().Services().Informer(),
			factory.Core().V1().Nodes().Informer(), factory.Discovery().V1().EndpointSlices().Informer(),
		}
	default:
		return fmt.Errorf("no anchor %q", flag)
	}
	// Handlers that do nothing: every event still goes through the
	// informer's queue to a listener, as the flatnet processes' do.
	nothing := func(any) {}
	var synced []cache.InformerSynced
	for _, inf := range infs {
		reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: nothing, DeleteFunc: nothing, UpdateFunc: func(_, cur any) {},
		})
		if err != nil {
			return err
		}
		synced = append(synced, reg.HasSynced)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("caches never synced")
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

// startAnchor starts the anchor named by flag against kubeconfig and
// waits for its caches.
func startAnchor(ctx context.Context, flag, kubeconfig string) (*anchor, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-"+flag, kubeconfig)
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
			err = fmt.Errorf("the anchor (-%s %s) ended before its caches synced; its error is above: %w", flag, kubeconfig, err)
		case strings.TrimSpace(line) != "synced":
			err = fmt.Errorf("the anchor said %q, not \"synced\"", line)
		}
		synced <- err
	}()
	select {
	case err = <-synced:
	case <-time.After(5 * time.Minute):
		err = fmt.Errorf("the anchor's (-%s) caches not synced in 5 minutes", flag)
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
