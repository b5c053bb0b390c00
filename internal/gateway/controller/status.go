package controller

// Status writing. The compiler gives desired statuses with
// LastTransitionTime unset; compile's Merge* functions merge them into
// what the object has (a condition keeps its time while its status holds,
// other controllers' route parents stay), and a status is written only
// when that differs, so a sync that changes nothing writes nothing.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/compile"
)

// statusMemo remembers, per route (one memo per kind), the desired parents last found
// written and the object's resourceVersion then: while both hold, the
// route needs no merge and no comparison. At 10,000 routes that keeps a
// status pass after each sync to map lookups and one small comparison
// per route. The status loop alone uses it.
type statusMemo map[types.NamespacedName]memoEntry

type memoEntry struct {
	rv   string
	want []gwv1.RouteParentStatus
}

func (m statusMemo) same(key types.NamespacedName, rv string, want []gwv1.RouteParentStatus) bool {
	e, ok := m[key]
	return ok && e.rv == rv && equality.Semantic.DeepEqual(e.want, want)
}

func (m statusMemo) set(key types.NamespacedName, rv string, want []gwv1.RouteParentStatus) {
	m[key] = memoEntry{rv, want}
}

// write brings one route's parents (cur, at resourceVersion rv) to want
// through update, which returns the written object's resourceVersion;
// a route the memo knows as written, or whose merged parents already
// equal cur, costs no call.
func (m statusMemo) write(key types.NamespacedName, rv string, cur, want []gwv1.RouteParentStatus, now metav1.Time,
	update func([]gwv1.RouteParentStatus) (string, error)) error {
	if m.same(key, rv, want) {
		return nil
	}
	if parents := compile.MergeRouteParents(cur, want, now); !equality.Semantic.DeepEqual(parents, cur) {
		var err error
		if rv, err = update(parents); err != nil {
			return err
		}
	}
	m.set(key, rv, want)
	return nil
}

// errRetry marks a status pass to run again soon (a write conflicted).
var errRetry = errors.New("status write conflicted: will retry")

// writeStatuses writes every desired status that differs from the
// object's. Objects gone from the cache are skipped (a conflict or a
// missing object is retried on the next sync, which the object's own
// event triggers).
func (c *Controller) writeStatuses(ctx context.Context, st *desiredStatus) error {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	var errs []error
	note := func(what string, err error) {
		switch {
		case err == nil || apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			// The cache was behind our own last write. Nothing else
			// will trigger a pass (status-only updates do not), so
			// ask for one.
			errs = append(errs, errRetry)
		default:
			errs = append(errs, fmt.Errorf("writing %s status: %w", what, err))
		}
	}
	gw := c.gw.GatewayV1()
	for name, want := range st.GatewayClasses {
		cur, err := c.listers.gatewayClasses.Get(name)
		if err != nil {
			continue
		}
		next := compile.MergeGatewayClassStatus(cur.Status, want, now)
		if !equality.Semantic.DeepEqual(next, cur.Status) {
			o := cur.DeepCopy()
			o.Status = next
			_, err = gw.GatewayClasses().UpdateStatus(ctx, o, metav1.UpdateOptions{FieldManager: ManagedBy})
			note("GatewayClass "+name, err)
		}
	}
	for key, want := range st.Gateways {
		cur, err := c.listers.gateways.Gateways(key.Namespace).Get(key.Name)
		if err != nil {
			continue
		}
		next := compile.MergeGatewayStatus(cur.Status, want, now)
		if !equality.Semantic.DeepEqual(next, cur.Status) {
			o := cur.DeepCopy()
			o.Status = next
			_, err = gw.Gateways(key.Namespace).UpdateStatus(ctx, o, metav1.UpdateOptions{FieldManager: ManagedBy})
			note("Gateway "+key.String(), err)
		}
	}
	for key, want := range st.HTTPRoutes {
		cur, err := c.listers.httpRoutes.HTTPRoutes(key.Namespace).Get(key.Name)
		if err != nil {
			continue
		}
		note("HTTPRoute "+key.String(), c.routeMemo.write(key, cur.ResourceVersion, cur.Status.Parents, want.Parents, now,
			func(parents []gwv1.RouteParentStatus) (string, error) {
				o := cur.DeepCopy()
				o.Status.Parents = parents
				got, err := gw.HTTPRoutes(key.Namespace).UpdateStatus(ctx, o, metav1.UpdateOptions{FieldManager: ManagedBy})
				if err != nil {
					return "", err
				}
				return got.ResourceVersion, nil
			}))
	}
	for key, want := range st.GRPCRoutes {
		cur, err := c.listers.grpcRoutes.GRPCRoutes(key.Namespace).Get(key.Name)
		if err != nil {
			continue
		}
		note("GRPCRoute "+key.String(), c.grpcMemo.write(key, cur.ResourceVersion, cur.Status.Parents, want.Parents, now,
			func(parents []gwv1.RouteParentStatus) (string, error) {
				o := cur.DeepCopy()
				o.Status.Parents = parents
				got, err := gw.GRPCRoutes(key.Namespace).UpdateStatus(ctx, o, metav1.UpdateOptions{FieldManager: ManagedBy})
				if err != nil {
					return "", err
				}
				return got.ResourceVersion, nil
			}))
	}
	// Routes gone from the output leave the memos too.
	maps.DeleteFunc(c.routeMemo, func(k types.NamespacedName, _ memoEntry) bool { _, ok := st.HTTPRoutes[k]; return !ok })
	maps.DeleteFunc(c.grpcMemo, func(k types.NamespacedName, _ memoEntry) bool { _, ok := st.GRPCRoutes[k]; return !ok })
	for key, want := range st.Ingresses {
		cur, err := c.listers.ingresses.Ingresses(key.Namespace).Get(key.Name)
		if err != nil {
			continue
		}
		if !equality.Semantic.DeepEqual(want, cur.Status) {
			o := cur.DeepCopy()
			o.Status = want
			_, err = c.kube.NetworkingV1().Ingresses(key.Namespace).UpdateStatus(ctx, o, metav1.UpdateOptions{FieldManager: ManagedBy})
			note("Ingress "+key.String(), err)
		}
	}
	return errors.Join(errs...)
}
