package e2e

// Services in the lab: the controller's EndpointSlices (--endpointslices)
// and every agent's nftables proxy (--proxy), end to end: ClusterIP from a
// pod on every node to every endpoint, an immediate refusal for a Service
// without endpoints, a deleted endpoint dropped, and NodePort from one
// node to another node's InternalIP.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/lab"
)

// dialAll asks the netexec pod client to make tries HTTP requests for its
// hostname to host:port, and returns the answers and the errors.
func dialAll(client labPod, host string, port, tries int) (answers, errs []string, err error) {
	path := fmt.Sprintf("/dial?request=hostname&protocol=http&host=%s&port=%d&tries=%d", host, port, tries)
	body, err := httpGet(lab.NetnsPath(client.node.Netns), net.JoinHostPort(client.ip, "8080"), path)
	if err != nil {
		return nil, nil, err
	}
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return nil, nil, fmt.Errorf("decoding /dial answer %q: %w", body, err)
	}
	return r.Responses, r.Errors, nil
}

func (l *testLab) createService(t *testing.T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	ctx := context.Background()
	got, err := l.c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s: %v", svc.Name, err)
	}
	t.Cleanup(func() { _ = l.c.CoreV1().Services("default").Delete(ctx, svc.Name, metav1.DeleteOptions{}) })
	return got
}

func service(name string, typ corev1.ServiceType, selector map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: selector,
			Ports:    []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func keys(m map[string]int) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkServices runs the Services checks on a running lab; clients are
// netexec pods, one per node.
func checkServices(t *testing.T, l *testLab, clients []labPod) {
	s := l.spec
	label := "svc-" + randHex(3)
	sel := map[string]string{"e2e-service": label}
	// The endpoints: one netexec pod per node, labelled for this test only.
	var backends []string
	for _, n := range s.Nodes {
		p := netexecPod(label+"-"+strconv.Itoa(n.Index), n.Name)
		p.Labels = sel
		l.create(t, p)
		backends = append(backends, p.Name)
	}
	deleted := map[string]bool{}
	t.Cleanup(func() {
		var left []string
		for _, b := range backends {
			if !deleted[b] {
				left = append(left, b)
			}
		}
		l.deleteAndWait(t, left...)
	})
	for _, b := range backends {
		l.waitReady(t, b)
	}
	web := l.createService(t, service(label+"-web", corev1.ServiceTypeClusterIP, sel))
	empty := l.createService(t, service(label+"-none", corev1.ServiceTypeClusterIP, map[string]string{"e2e-service": label + "-nothing"}))
	np := l.createService(t, service(label+"-np", corev1.ServiceTypeNodePort, sel))
	vip := web.Spec.ClusterIP
	t.Logf("services: %s %s (%v), %s %s, %s nodePort %d", web.Name, vip, backends, empty.Name, empty.Spec.ClusterIP, np.Name, np.Spec.Ports[0].NodePort)

	// seenFrom polls client's /dial to the ClusterIP until every wanted
	// hostname has answered (and, with exclusive, a round answered only
	// by them, every try).
	seenFrom := func(t *testing.T, client labPod, want []string, exclusive bool) {
		t.Helper()
		seen := map[string]int{}
		var last string
		err := retry(30*time.Second, func() error {
			answers, errs, err := dialAll(client, vip, 80, 30)
			if err != nil {
				return err
			}
			round := map[string]int{}
			for _, a := range answers {
				round[strings.TrimSpace(a)]++
				seen[strings.TrimSpace(a)]++
			}
			last = fmt.Sprintf("last round: answers %v, errors %q", round, errs)
			for _, w := range want {
				if seen[w] == 0 {
					return fmt.Errorf("%s not seen yet", w)
				}
			}
			if exclusive {
				if len(errs) > 0 || len(answers) != 30 {
					return fmt.Errorf("errors in the round")
				}
				for h := range round {
					if !contains(want, h) {
						return fmt.Errorf("%s still answers", h)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s on %s -> %s:80: want answers from %v: %v (all answers %v; %s)", client.name, client.node.Name, vip, want, err, keys(seen), last)
		}
	}

	t.Run("ClusterIPFromEveryNodeReachesEveryEndpoint", func(t *testing.T) {
		for _, c := range clients {
			seenFrom(t, c, backends, true)
		}
	})

	t.Run("NoEndpointsRefusedAtOnce", func(t *testing.T) {
		for _, c := range clients {
			var last string
			err := retry(30*time.Second, func() error {
				answers, errs, err := dialAll(c, empty.Spec.ClusterIP, 80, 1)
				if err != nil {
					return err
				}
				// A refusal (TCP reset from the proxy), not a dial timeout.
				last = fmt.Sprintf("answers %q, errors %q", answers, errs)
				if len(answers) != 0 || len(errs) != 1 || !strings.Contains(errs[0], "connection refused") {
					return fmt.Errorf("not refused")
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s -> %s:80 (no endpoints): want connection refused: %v (%s)", c.name, empty.Spec.ClusterIP, err, last)
			}
		}
	})

	t.Run("NodePortFromAnotherNode", func(t *testing.T) {
		port := int(np.Spec.Ports[0].NodePort)
		for i, from := range s.Nodes {
			to := s.Nodes[(i+1)%len(s.Nodes)]
			seen := map[string]int{}
			err := retry(30*time.Second, func() error {
				body, err := httpGet(lab.NetnsPath(from.Netns), net.JoinHostPort(to.IP.String(), strconv.Itoa(port)), "/hostname")
				if err != nil {
					return err
				}
				h := strings.TrimSpace(body)
				if !contains(backends, h) {
					return fmt.Errorf("answer %q is not an endpoint", h)
				}
				seen[h]++
				return nil
			})
			if err != nil {
				t.Errorf("node %s -> %s:%d (NodePort): %v", from.Name, to.IP, port, err)
			} else {
				t.Logf("node %s -> %s:%d answered by %v", from.Name, to.IP, port, keys(seen))
			}
		}
	})

	t.Run("DeletedEndpointNoLongerAnswers", func(t *testing.T) {
		gone := backends[len(backends)-1]
		l.deleteAndWait(t, gone)
		deleted[gone] = true
		for _, c := range clients {
			seenFrom(t, c, backends[:len(backends)-1], true)
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
