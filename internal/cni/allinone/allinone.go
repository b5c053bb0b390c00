// Package allinone is the `flatnet` CNI plugin type: bridge (with
// host-local IPAM in process, as bridge always runs it), bandwidth and
// portmap in one process, reading one network config with the options of
// all three and their runtime capabilities (ips, mac, bandwidth,
// portMappings).
//
// Design. The classic conflist chains three plugin processes, and the
// runtime starts each for every verb; here the same three plugins run as
// stages of one process (plugin.Stage: their verbs, with ADD returning the
// result instead of printing it). Each stage reads the network config
// with "type" set to its own name, and ADD threads the result: bridge's is
// bandwidth's prevResult, bandwidth's is portmap's, as libcni would pass
// them. So the options, the state on disk (host-local's reservations, the
// IFBs, the nftables tables) and the error codes are the classic chain's,
// and a node can switch between the two conflists without leftovers.
//
// Unlike a chain, the plugin undoes its own failed ADD: the stages that
// succeeded are deleted, so a failed ADD leaves nothing behind even when
// the runtime does not call DEL. DEL runs every stage even after one fails
// (each is idempotent) and reports all failures; CHECK and STATUS stop at
// the first.
//
// ADD runs a stage that hands its prevResult on unchanged (PassThrough:
// portmap) beside the stage before it (bandwidth), both on that stage's
// prevResult: neither reads what the other makes.
//
// DEL takes what every stage put in the kernel down at once (the stages'
// Unhook, or Del for a stage without one), then releases the address (the
// stages' Release). Each stage finds what it made by name (the veth, the
// IFB, the chains and map elements) without the others. Removing a link
// or a rule waits for the kernel (an RCU grace period apiece, ~15 ms
// here): in a chain those waits add up, here they overlap, and the links
// the Unhooks hand over (the veth's host end, the IFB) are not removed
// but parked (down at once, removed later by a collector:
// internal/cni/parking) as soon as those Unhooks returned, while the
// stages without one still run. Undoing a failed ADD deletes them, in
// one request (netlinkx.LinkBatch). The address goes last, alone, and
// only when every stage came down: no interface or rule of the pod may
// still hold an address that another pod can already have.
package allinone

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/bandwidth"
	"github.com/flatnet/flatnet/internal/cni/bridge"
	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/parking"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/cni/portmap"
	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Name is the plugin type.
const Name = "flatnet"

// Plugin is the flatnet type as a CNI plugin.
var Plugin = plugin.Plugin{Name: Name, Funcs: New(bridge.Stage, bandwidth.Stage, portmap.Stage).Funcs()}

// linkBatch takes the links the stages' Unhooks remove and removes them
// together in Flush.
type linkBatch interface {
	netlinkx.LinkDeleter
	Flush() error
}

// newLinks returns the batch of a DEL: one that parks the links (down, for
// a collector: internal/cni/parking), or, undoing a failed ADD, which
// must leave nothing behind, one that deletes them. Tests replace it.
var newLinks = func(undo bool) linkBatch {
	if undo {
		return netlinkx.NewLinkBatch()
	}
	return parking.New()
}

// Chain runs stages in one process.
type Chain struct {
	stages []plugin.Stage
}

// New returns the chain of stages, in ADD order.
func New(stages ...plugin.Stage) *Chain { return &Chain{stages: stages} }

// Funcs are the chain's verbs as a plugin's.
func (c *Chain) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add: func(args *skel.CmdArgs) error {
			r, err := c.Add(args)
			if err != nil {
				return err
			}
			if err := r.Print(); err != nil {
				return errors.Join(cnierr.Wrap(cnierr.IOFailure, err, "%s: printing the result", Name), c.Del(args))
			}
			return nil
		},
		Del: c.Del, Check: c.Check, GC: c.GC, Status: c.Status,
	}
}

// config is the network config as raw fields, to be handed to each stage
// with its own type (and, for ADD, the previous stage's result).
type config map[string]json.RawMessage

func parse(stdin []byte) (config, error) {
	var conf config
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "%s: decoding network config", Name)
	}
	if conf == nil {
		return nil, cnierr.New(cnierr.DecodingFailure, "%s: network config is null", Name)
	}
	return conf, nil
}

// forStage is args with stdin set to conf as stage reads it: its type, and
// prev as prevResult when not nil.
func (conf config) forStage(args *skel.CmdArgs, stage string, prev types.Result) (*skel.CmdArgs, error) {
	out := make(config, len(conf)+1)
	for k, v := range conf {
		out[k] = v
	}
	out["type"], _ = json.Marshal(stage)
	if prev != nil {
		b, err := json.Marshal(prev)
		if err != nil {
			return nil, cnierr.Wrap(cnierr.Internal, err, "%s: encoding %s's prevResult", Name, stage)
		}
		out["prevResult"] = b
	}
	stdin, err := json.Marshal(out)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.Internal, err, "%s: encoding %s's config", Name, stage)
	}
	a := *args
	a.StdinData = stdin
	return &a, nil
}

// Add runs every stage's ADD, each on the result of the one before, and
// returns the last result; on a failure it deletes what the stages before
// made.
func (c *Chain) Add(args *skel.CmdArgs) (types.Result, error) {
	conf, err := parse(args.StdinData)
	if err != nil {
		return nil, err
	}
	var prev types.Result // the runtime's prevResult, if any, stays in conf
	add := func(s plugin.Stage, prev types.Result) (types.Result, error) {
		a, err := conf.forStage(args, s.Name, prev)
		if err != nil {
			return nil, err
		}
		return s.Add(a)
	}
	for i := 0; i < len(c.stages); i++ {
		s := c.stages[i]
		undo := c.stages[:i] // a failed stage removes what it made
		var err error
		if i+1 < len(c.stages) && c.stages[i+1].PassThrough {
			// The next stage hands its prevResult on as it is: it runs
			// beside this one (bandwidth's IFB and qdiscs beside
			// portmap's rules and conntrack flush), and this one's
			// result is the pair's. Either failing, both are undone.
			var wg sync.WaitGroup
			var nextErr error
			wg.Go(func() { _, nextErr = add(c.stages[i+1], prev) })
			prev, err = add(s, prev)
			wg.Wait()
			if err = errors.Join(err, nextErr); err != nil {
				undo = c.stages[:i+2]
			}
			i++
		} else {
			prev, err = add(s, prev)
		}
		if err != nil {
			if uerr := c.del(conf, args, undo, true); uerr != nil {
				err = errors.Join(err, fmt.Errorf("%s: undoing the failed ADD: %w", Name, uerr))
			}
			return nil, err
		}
	}
	return prev, nil
}

// Del runs every stage's DEL, the first stage's last, and reports every
// failure.
func (c *Chain) Del(args *skel.CmdArgs) error {
	conf, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	return c.del(conf, args, c.stages, false)
}

// del deletes what stages made: every stage's Unhook (or Del) at once,
// then, when all succeeded, the Releases (see the top of the file). The
// failures are joined last stage first, as a chain's DEL meets them.
func (c *Chain) del(conf config, args *skel.CmdArgs, stages []plugin.Stage, undo bool) error {
	errs := make([]error, len(stages))
	links := newLinks(undo)
	// The links the Unhooks hand over (the veth's host end, the IFB) are
	// parked (or, undoing an ADD, deleted in one request) as soon as every
	// Unhook has returned: the stages without one (portmap's rules and
	// conntrack entries) go on meanwhile.
	var all, hooks sync.WaitGroup
	for _, s := range stages {
		if s.Unhook != nil {
			hooks.Add(1)
		}
	}
	var flushErr error
	all.Go(func() { hooks.Wait(); flushErr = links.Flush() })
	for i, s := range stages {
		unhook := s.Del
		if s.Unhook != nil {
			unhook = func(a *skel.CmdArgs) error { return s.Unhook(a, links) }
		}
		all.Go(func() {
			errs[len(stages)-1-i] = run(conf, args, []plugin.Stage{s}, func(plugin.Stage) verb { return unhook }, true)
			if s.Unhook != nil {
				hooks.Done()
			}
		})
	}
	all.Wait()
	if err := errors.Join(append(errs, flushErr)...); err != nil {
		return err
	}
	return run(conf, args, stages, func(s plugin.Stage) verb { return s.Release }, true)
}

// Check runs every stage's CHECK with the runtime's prevResult (the
// chain's last result), stopping at the first failure.
func (c *Chain) Check(args *skel.CmdArgs) error {
	return c.each(args, func(s plugin.Stage) verb { return s.Check }, false)
}

// Status runs every stage's STATUS, stopping at the first failure.
func (c *Chain) Status(args *skel.CmdArgs) error {
	return c.each(args, func(s plugin.Stage) verb { return s.Status }, false)
}

// GC runs every stage's GC and reports every failure.
func (c *Chain) GC(args *skel.CmdArgs) error {
	return c.each(args, func(s plugin.Stage) verb { return s.GC }, true)
}

type verb = func(*skel.CmdArgs) error

func (c *Chain) each(args *skel.CmdArgs, pick func(plugin.Stage) verb, all bool) error {
	conf, err := parse(args.StdinData)
	if err != nil {
		return err
	}
	return run(conf, args, c.stages, pick, all)
}

// run calls each stage's verb in order: with all, every one of them,
// joining the failures (the first failure's code is the join's:
// cnierr.Code); without, up to the first failure.
func run(conf config, args *skel.CmdArgs, stages []plugin.Stage, pick func(plugin.Stage) verb, all bool) error {
	var errs []error
	for _, s := range stages {
		v := pick(s)
		if v == nil {
			continue // a stage without this part (Release)
		}
		a, err := conf.forStage(args, s.Name, nil)
		if err == nil {
			err = v(a)
		}
		if err != nil {
			if !all {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
