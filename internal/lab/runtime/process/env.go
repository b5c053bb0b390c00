package process

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Container environment, computed as the kubelet does
// (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables): envFrom first,
// then env in order (values expanded with $(VAR) against the variables
// defined so far and the service variables, valueFrom resolved), then the
// service variables not already set. The runtime adds what a container
// runtime would: PATH (with the lab's binaries first) and HOSTNAME.

// envSources resolves references to other objects; nil functions make
// such references fail with a clear error.
type envSources struct {
	ConfigMap  func(namespace, name string) (*v1.ConfigMap, error)
	Secret     func(namespace, name string) (*v1.Secret, error)
	IsNotFound func(error) bool
}

// envInput is everything the environment depends on.
type envInput struct {
	Pod       *v1.Pod
	Container *v1.Container
	PodIPs    []string
	NodeIP    string
	Hostname  string
	Services  []*v1.Service // all known; filtered here
	PodPath   string        // dirs put first on PATH
	Sources   envSources
}

// masterServices are the default-namespace services every pod gets
// variables for, whatever enableServiceLinks says.
var masterServices = map[string]bool{"kubernetes": true}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// serviceEnv returns the service link variables for a pod in namespace ns.
func serviceEnv(services []*v1.Service, ns string, enableLinks bool) map[string]string {
	chosen := map[string]*v1.Service{}
	for _, s := range services {
		if !serviceIPSet(s) {
			continue
		}
		if s.Namespace == "default" && masterServices[s.Name] {
			if _, ok := chosen[s.Name]; !ok {
				chosen[s.Name] = s
			}
		} else if s.Namespace == ns && enableLinks {
			chosen[s.Name] = s
		}
	}
	m := map[string]string{}
	for _, s := range chosen {
		for _, e := range serviceVars(s) {
			m[e[0]] = e[1]
		}
	}
	return m
}

func serviceIPSet(s *v1.Service) bool {
	return s.Spec.ClusterIP != "" && s.Spec.ClusterIP != v1.ClusterIPNone && len(s.Spec.Ports) > 0
}

func envName(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

// serviceVars are one service's variables, in the kubelet's order.
func serviceVars(s *v1.Service) [][2]string {
	prefix := envName(s.Name)
	ip := s.Spec.ClusterIP
	out := [][2]string{
		{prefix + "_SERVICE_HOST", ip},
		{prefix + "_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port))},
	}
	for _, p := range s.Spec.Ports {
		if p.Name != "" {
			out = append(out, [2]string{prefix + "_SERVICE_PORT_" + envName(p.Name), strconv.Itoa(int(p.Port))})
		}
	}
	for i, p := range s.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(v1.ProtocolTCP)
		}
		lower := strings.ToLower(proto)
		hp := net.JoinHostPort(ip, strconv.Itoa(int(p.Port)))
		if i == 0 {
			out = append(out, [2]string{prefix + "_PORT", lower + "://" + hp})
		}
		pp := fmt.Sprintf("%s_PORT_%d_%s", prefix, p.Port, strings.ToUpper(proto))
		out = append(out,
			[2]string{pp, lower + "://" + hp},
			[2]string{pp + "_PROTO", lower},
			[2]string{pp + "_PORT", strconv.Itoa(int(p.Port))},
			[2]string{pp + "_ADDR", ip},
		)
	}
	return out
}

// containerEnv computes the container's environment as "K=V" strings: the
// declared variables in order, then the service variables sorted, then
// PATH and HOSTNAME unless declared.
func containerEnv(in envInput) ([]string, error) {
	pod, c := in.Pod, in.Container
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	svc := serviceEnv(in.Services, pod.Namespace, links)

	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, ef := range c.EnvFrom {
		data, err := in.envFromData(pod.Namespace, ef)
		if err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			set(ef.Prefix+k, data[k])
		}
	}
	lookup := func(name string) (string, bool) {
		if v, ok := vals[name]; ok {
			return v, true
		}
		v, ok := svc[name]
		return v, ok
	}
	for _, e := range c.Env {
		switch {
		case e.Value != "":
			set(e.Name, expand(e.Value, lookup))
		case e.ValueFrom != nil:
			v, skip, err := in.valueFrom(e)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			if !skip {
				set(e.Name, v)
			}
		default:
			set(e.Name, "")
		}
	}
	var svcKeys []string
	for k := range svc {
		if _, ok := vals[k]; !ok {
			svcKeys = append(svcKeys, k)
		}
	}
	sort.Strings(svcKeys)
	for _, k := range svcKeys {
		set(k, svc[k])
	}
	if _, ok := vals["PATH"]; !ok {
		p := defaultPath
		if in.PodPath != "" {
			p = in.PodPath + ":" + p
		}
		set("PATH", p)
	}
	if _, ok := vals["HOSTNAME"]; !ok {
		set("HOSTNAME", in.Hostname)
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out, nil
}

func (in envInput) envFromData(ns string, ef v1.EnvFromSource) (map[string]string, error) {
	switch {
	case ef.ConfigMapRef != nil:
		optional := ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional
		cm, err := in.configMap(ns, ef.ConfigMapRef.Name)
		if err != nil {
			if optional && in.notFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom configMap %s: %w", ef.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	case ef.SecretRef != nil:
		optional := ef.SecretRef.Optional != nil && *ef.SecretRef.Optional
		s, err := in.secret(ns, ef.SecretRef.Name)
		if err != nil {
			if optional && in.notFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("envFrom secret %s: %w", ef.SecretRef.Name, err)
		}
		m := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			m[k] = string(v)
		}
		return m, nil
	}
	return nil, nil
}

func (in envInput) configMap(ns, name string) (*v1.ConfigMap, error) {
	if in.Sources.ConfigMap == nil {
		return nil, fmt.Errorf("no API access to read configMap %s/%s", ns, name)
	}
	return in.Sources.ConfigMap(ns, name)
}

func (in envInput) secret(ns, name string) (*v1.Secret, error) {
	if in.Sources.Secret == nil {
		return nil, fmt.Errorf("no API access to read secret %s/%s", ns, name)
	}
	return in.Sources.Secret(ns, name)
}

func (in envInput) notFound(err error) bool {
	return in.Sources.IsNotFound != nil && in.Sources.IsNotFound(err)
}

// valueFrom resolves one env var's source; skip is true for a missing
// optional key.
func (in envInput) valueFrom(e v1.EnvVar) (val string, skip bool, err error) {
	vf := e.ValueFrom
	switch {
	case vf.FieldRef != nil:
		v, err := in.fieldRef(vf.FieldRef.FieldPath)
		return v, false, err
	case vf.ResourceFieldRef != nil:
		return "", false, fmt.Errorf("resourceFieldRef (%s) is not supported by the lab runtime (no cgroups)", vf.ResourceFieldRef.Resource)
	case vf.ConfigMapKeyRef != nil:
		r := vf.ConfigMapKeyRef
		optional := r.Optional != nil && *r.Optional
		cm, err := in.configMap(in.Pod.Namespace, r.Name)
		if err != nil {
			if optional && in.notFound(err) {
				return "", true, nil
			}
			return "", false, err
		}
		v, ok := cm.Data[r.Key]
		if !ok {
			if optional {
				return "", true, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", r.Key, in.Pod.Namespace, r.Name)
		}
		return v, false, nil
	case vf.SecretKeyRef != nil:
		r := vf.SecretKeyRef
		optional := r.Optional != nil && *r.Optional
		s, err := in.secret(in.Pod.Namespace, r.Name)
		if err != nil {
			if optional && in.notFound(err) {
				return "", true, nil
			}
			return "", false, err
		}
		v, ok := s.Data[r.Key]
		if !ok {
			if optional {
				return "", true, nil
			}
			return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", r.Key, in.Pod.Namespace, r.Name)
		}
		return string(v), false, nil
	}
	return "", false, fmt.Errorf("valueFrom has no source this runtime supports")
}

// fieldRef is the downward API for env vars.
func (in envInput) fieldRef(path string) (string, error) {
	pod := in.Pod
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return in.NodeIP, nil
	case "status.podIP":
		if len(in.PodIPs) > 0 {
			return in.PodIPs[0], nil
		}
		return "", nil
	case "status.podIPs":
		return strings.Join(in.PodIPs, ","), nil
	}
	for _, m := range []struct {
		prefix string
		data   map[string]string
	}{{"metadata.labels", pod.Labels}, {"metadata.annotations", pod.Annotations}} {
		if path == m.prefix {
			keys := make([]string, 0, len(m.data))
			for k := range m.data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			lines := make([]string, 0, len(keys))
			for _, k := range keys {
				lines = append(lines, k+"="+strconv.Quote(m.data[k]))
			}
			return strings.Join(lines, "\n"), nil
		}
		if rest, ok := strings.CutPrefix(path, m.prefix+"['"); ok && strings.HasSuffix(rest, "']") {
			return m.data[strings.TrimSuffix(rest, "']")], nil
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

// expand replaces $(VAR) with lookup's value as Kubernetes does: $$ is a
// literal $, and an unknown or unterminated reference stays as written.
func expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// commandLine is the container's argv: command and args with $(VAR)
// expanded against its environment.
func commandLine(c *v1.Container, env []string) ([]string, error) {
	if len(c.Command) == 0 {
		return nil, fmt.Errorf("container %q has no command: the lab runs programs from the host and cannot use an image's entrypoint; set command", c.Name)
	}
	vals := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	lookup := func(n string) (string, bool) { v, ok := vals[n]; return v, ok }
	argv := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range c.Command {
		argv = append(argv, expand(a, lookup))
	}
	for _, a := range c.Args {
		argv = append(argv, expand(a, lookup))
	}
	return argv, nil
}
