package kube

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/watchlist"
)

// Every flatnet client speaks protobuf and asks for no gzip (see Config).
func TestConfigProtobufWithoutCompression(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(kc, "flatnet-test")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.DisableCompression || cfg.ContentType != "application/vnd.kubernetes.protobuf" || cfg.UserAgent != "flatnet-test" {
		t.Errorf("config: compression off %v, content type %q, user agent %q", cfg.DisableCompression, cfg.ContentType, cfg.UserAgent)
	}
}

// A reflector over ListFirst's client starts from a LIST; over the plain
// client it would stream (client-go's default).
func TestListFirst(t *testing.T) {
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:6443"})
	if err != nil {
		t.Fatal(err)
	}
	if watchlist.DoesClientNotSupportWatchListSemantics(c) {
		t.Error("a plain clientset already opts out of WatchList: ListFirst is no longer needed")
	}
	if !watchlist.DoesClientNotSupportWatchListSemantics(ListFirst(c)) {
		t.Error("the reflector would still stream over ListFirst's client")
	}
}
