package lab

// Simulated nodes (up --simulated-nodes N): kwok runs as one more lab
// daemon (pid file, <state>/logs/kwok.log, stopped by down with the
// others) with its config file written from Go (simnodes.KwokConfig), and
// `up` makes the Node objects exactly 1..N with simnodes.Scale, then waits
// until every one is Ready (kwok) and has a podCIDR (flatnet's
// controller). What is and is not real: docs/lab.md, "Simulated nodes".

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/flatnet/flatnet/internal/atomicfile"
	"github.com/flatnet/flatnet/internal/lab/simnodes"
	"github.com/flatnet/flatnet/internal/proc"
)

// KwokConfigFile is kwok's config file (options and Stages).
func (s *Spec) KwokConfigFile() string { return filepath.Join(s.StateDir, "kwok.yaml") }

// kwokConfig is the content of KwokConfigFile.
func (s *Spec) kwokConfig() []byte {
	return simnodes.KwokConfig(simnodes.MaxPodsPerNode(s.NodeCIDRMaskSize))
}

// kwokArgv is kwok's command line in lab s.
func kwokArgv(s *Spec, bin string) []string {
	return simnodes.KwokArgv(bin, s.Kubeconfig(), s.KwokConfigFile())
}

// observeKwok tells whether kwok runs, and whether with another command
// line or config than kwokArgv(s, bin) and s.kwokConfig() (bin "": any
// program path).
func observeKwok(s *Spec, bin string) (running, outdated bool) {
	pid, ok := proc.Running(s.StateDir, ProcKwok)
	if !ok {
		return false, false
	}
	have, err := os.ReadFile(s.KwokConfigFile())
	return true, err != nil || !bytes.Equal(have, s.kwokConfig()) || !sameArgs(pid, kwokArgv(s, bin))
}

// upKwok writes kwok's config and starts it (stopping a running one
// first when restart).
func upKwok(s *Spec, bin string, restart bool) error {
	if restart {
		if err := proc.Stop(s.StateDir, ProcKwok, 10*time.Second); err != nil {
			return err
		}
	}
	if err := atomicfile.WriteFile(s.KwokConfigFile(), s.kwokConfig(), 0o644); err != nil {
		return fmt.Errorf("writing kwok's config: %w", err)
	}
	if _, err := proc.Start(ProcKwok, kwokArgv(s, bin), nil, s.StateDir, ""); err != nil {
		return fmt.Errorf("starting kwok: %w", err)
	}
	return nil
}

// simulatedTimeout bounds the wait for n simulated nodes: the Ready
// timeout plus 30 ms a node (flatnet's controller gave 5,000 nodes their
// podCIDRs in about 130 s on 2 cores).
func simulatedTimeout(ready time.Duration, n int) time.Duration {
	if ready == 0 {
		ready = 2 * time.Minute
	}
	return ready + time.Duration(n)*30*time.Millisecond
}

// scaleSimulated makes s's simulated nodes exactly 1..N and, when N > 0,
// waits until they are Ready with podCIDRs. It returns what it did and
// how long each part took, for up's step line.
func scaleSimulated(ctx context.Context, s *Spec, kubeconfig string, readyTimeout time.Duration) (string, error) {
	c, err := simnodes.NewClient(kubeconfig)
	if err != nil {
		return "", err
	}
	start := time.Now()
	plan, listed, err := simnodes.Scale(ctx, c, s.SimConfig(), s.SimulatedNodes, 0)
	if err != nil {
		return "", err
	}
	applied := time.Since(start)
	detail := fmt.Sprintf("%s in %s", plan.Describe(), roundDur(applied))
	if s.SimulatedNodes == 0 {
		return detail, nil
	}
	wctx, cancel := context.WithTimeout(ctx, simulatedTimeout(readyTimeout, s.SimulatedNodes))
	defer cancel()
	t, err := simnodes.WaitReady(wctx, c, s.Name, s.SimulatedNodes, start, listed)
	if err != nil {
		if _, ok := proc.Running(s.StateDir, ProcKwok); !ok {
			log := proc.LogFile(s.StateDir, ProcKwok)
			return "", fmt.Errorf("%w; kwok exited, end of %s:\n%s", err, log, proc.Tail(log, 15))
		}
		return "", fmt.Errorf("%w (logs: %s, %s)", err, proc.LogFile(s.StateDir, ProcKwok), proc.LogFile(s.StateDir, ProcController))
	}
	return fmt.Sprintf("%s; all %d with a podCIDR after %s, Ready after %s", detail, s.SimulatedNodes, roundDur(t.PodCIDRs), roundDur(t.Ready)), nil
}
