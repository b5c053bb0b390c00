package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// applyFrontends makes the frontend Services and EndpointSlices match p:
// creates what is missing, updates what differs (keeping what others own:
// the cluster IPs, node ports, status), deletes frontends nothing wants.
// existing are the labelled frontend Services, slices their slices: by
// Service, by slice name. A Service's slices that p no longer wants (the
// cluster shrank) are deleted.
func applyFrontends(ctx context.Context, c kubernetes.Interface, p frontendPlan, existing []*corev1.Service, slices map[types.NamespacedName]map[string]*discoveryv1.EndpointSlice) error {
	var errs []error
	want := map[types.NamespacedName]bool{}
	have := map[types.NamespacedName]*corev1.Service{}
	for _, s := range existing {
		have[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	for i, svc := range p.Services {
		key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		want[key] = true
		cur, err := ensureService(ctx, c, svc, have[key])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		curSlices := slices[key]
		wanted := map[string]bool{}
		for _, es := range p.Slices[i] {
			wanted[es.Name] = true
			es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: cur.Name, UID: cur.UID}}
			if err := ensureSlice(ctx, c, es, curSlices[es.Name]); err != nil {
				errs = append(errs, err)
			}
		}
		for name, es := range curSlices {
			if wanted[name] {
				continue
			}
			err := c.DiscoveryV1().EndpointSlices(es.Namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &es.UID}})
			if err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting EndpointSlice %s/%s: %w", es.Namespace, name, err))
			}
		}
	}
	for key, s := range have {
		if want[key] {
			continue
		}
		// The slice goes with it (owner reference).
		err := c.CoreV1().Services(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting frontend Service %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

func ensureService(ctx context.Context, c kubernetes.Interface, want, cur *corev1.Service) (*corev1.Service, error) {
	api := c.CoreV1().Services(want.Namespace)
	if cur == nil {
		s, err := api.Create(ctx, want, metav1.CreateOptions{FieldManager: ManagedBy})
		if apierrors.IsAlreadyExists(err) {
			// Someone else's Service of that name: say so, do not take it.
			return nil, fmt.Errorf("frontend Service %s/%s exists without label %s: rename or delete it", want.Namespace, want.Name, LabelGateway)
		}
		if err != nil {
			return nil, fmt.Errorf("creating frontend Service %s/%s: %w", want.Namespace, want.Name, err)
		}
		return s, nil
	}
	next := cur.DeepCopy()
	next.Labels = want.Labels
	next.OwnerReferences = want.OwnerReferences
	next.Spec.Type = want.Spec.Type
	next.Spec.ExternalTrafficPolicy = want.Spec.ExternalTrafficPolicy
	next.Spec.Selector = nil
	next.Spec.Ports = mergePorts(want.Spec.Ports, cur.Spec.Ports)
	if equality.Semantic.DeepEqual(next.ObjectMeta.Labels, cur.Labels) &&
		equality.Semantic.DeepEqual(next.OwnerReferences, cur.OwnerReferences) &&
		equality.Semantic.DeepEqual(next.Spec, cur.Spec) {
		return cur, nil
	}
	s, err := api.Update(ctx, next, metav1.UpdateOptions{FieldManager: ManagedBy})
	if err != nil {
		return nil, fmt.Errorf("updating frontend Service %s/%s: %w", want.Namespace, want.Name, err)
	}
	return s, nil
}

// mergePorts is want with the node ports the API server gave cur's ports
// of the same number kept, so an update does not move them.
func mergePorts(want, cur []corev1.ServicePort) []corev1.ServicePort {
	out := make([]corev1.ServicePort, len(want))
	for i, p := range want {
		for _, c := range cur {
			if c.Port == p.Port && c.Protocol == p.Protocol {
				p.NodePort = c.NodePort
			}
		}
		out[i] = p
	}
	return out
}

func ensureSlice(ctx context.Context, c kubernetes.Interface, want, cur *discoveryv1.EndpointSlice) error {
	api := c.DiscoveryV1().EndpointSlices(want.Namespace)
	if cur == nil {
		_, err := api.Create(ctx, want, metav1.CreateOptions{FieldManager: ManagedBy})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating EndpointSlice %s/%s: %w", want.Namespace, want.Name, err)
		}
		return nil
	}
	if equality.Semantic.DeepEqual(want.Labels, cur.Labels) && equality.Semantic.DeepEqual(want.OwnerReferences, cur.OwnerReferences) &&
		equality.Semantic.DeepEqual(want.Endpoints, cur.Endpoints) && equality.Semantic.DeepEqual(want.Ports, cur.Ports) {
		return nil
	}
	next := cur.DeepCopy()
	next.Labels, next.OwnerReferences, next.Endpoints, next.Ports = want.Labels, want.OwnerReferences, want.Endpoints, want.Ports
	if _, err := api.Update(ctx, next, metav1.UpdateOptions{FieldManager: ManagedBy}); err != nil {
		return fmt.Errorf("updating EndpointSlice %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}
