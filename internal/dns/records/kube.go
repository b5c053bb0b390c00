package records

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// FromClientset fills ix with every Service, EndpointSlice and Pod cs lists
// (tests and one-shot tools; the agent feeds the index from informers).
func (ix *Index) FromClientset(ctx context.Context, cs kubernetes.Interface) error {
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list services: %w", err)
	}
	for i := range svcs.Items {
		ix.UpsertService(&svcs.Items[i])
	}
	eps, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list endpointslices: %w", err)
	}
	for i := range eps.Items {
		ix.UpsertEndpointSlice(&eps.Items[i])
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		ix.UpsertPod(&pods.Items[i])
	}
	return nil
}
