package endpointslice

// Interned label sets and ports. The pods of one workload carry the same
// labels (a ReplicaSet's replicas differ in none) and the same container
// ports, and a map of a few labels is ~300 bytes, a port 64: at 100,000
// pods that is 30 MB of identical maps and 7.5 MB of identical port lists
// in the pod cache. Transform gives every pod with the same labels and
// ports one shared, read-only map and port lists. The table (intern.go)
// holds each set weakly: a set lives as long as some cached Pod points to
// it (Pod.template).

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// podTemplate is the labels and container ports the pods of one template
// share, interned; nothing is written once made.
type podTemplate struct {
	m                   map[string]string
	ports, sidecarPorts []corev1.ContainerPort
}

var templateTable = newInternTable[podTemplate]()

// internTemplate returns the shared set equal to l, ports and sidecarPorts
// (nil when all are empty).
func internTemplate(l map[string]string, ports, sidecarPorts []corev1.ContainerPort) *podTemplate {
	if len(l) == 0 && len(ports) == 0 && len(sidecarPorts) == 0 {
		return nil
	}
	key := labelKey(l) + containerPortsKey(ports) + containerPortsKey(sidecarPorts)
	return templateTable.get(key, func() *podTemplate {
		return &podTemplate{m: maps.Clone(l), ports: slices.Clip(slices.Clone(ports)), sidecarPorts: slices.Clip(slices.Clone(sidecarPorts))}
	})
}

// containerPortsKey is ps in one string, after a \x01 (in no label, name or
// address), each port NUL-terminated.
func containerPortsKey(ps []corev1.ContainerPort) string {
	var b strings.Builder
	b.WriteByte(1)
	for _, p := range ps {
		b.WriteString(p.Name)
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(int(p.ContainerPort)))
		b.WriteByte(' ')
		b.WriteString(string(p.Protocol))
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(int(p.HostPort)))
		b.WriteByte(' ')
		b.WriteString(p.HostIP)
		b.WriteByte(0)
	}
	return b.String()
}

// labelKey is l in one string: sorted key=value pairs, NUL-separated (NUL
// is in no label key or value).
func labelKey(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}
