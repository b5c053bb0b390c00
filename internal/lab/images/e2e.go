package images

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/flatnet/flatnet/internal/dirlock"
	"github.com/flatnet/flatnet/internal/lab/controlplane"
)

// The names and tags of k8s.io/kubernetes v1.37.2's test/utils/image
// manifest.go (registry.k8s.io/e2e-test-images is its promoterE2eRegistry),
// and deploy/flatnet.yaml's image.
const (
	AgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	// AgnhostCNPRef is the agnhost the ClusterNetworkPolicy conformance
	// suite (sigs.k8s.io/network-policy-api v0.3.0, conformance/base)
	// names: the lab's agnhost under that tag too (see Inputs.AgnhostCNP).
	AgnhostCNPRef = "registry.k8s.io/e2e-test-images/agnhost:2.45"
	GlibcDNSRef   = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	BusyboxRef    = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	NginxRef      = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	// The Gateway API conformance suite's backends (sigs.k8s.io/gateway-api
	// conformance v1.6.3, base/manifests.yaml): echo-basic under both tags
	// it names (v1.6.0-dev.3 runs infra-backend-v3, for the retry tests; the
	// v1.6.3 source serves those too), and CoreDNS for its UDP backend.
	EchoBasicRef    = "registry.k8s.io/gateway-api/echo-basic:v1.5.1"
	EchoBasicDevRef = "registry.k8s.io/gateway-api/echo-basic:v1.6.0-dev.3"
	CoreDNSRef      = "registry.k8s.io/coredns/coredns:v1.12.2"
	// deploy/flatnet.yaml's "flatnet:dev", as the kubelet normalizes it.
	FlatnetRef  = "docker.io/library/flatnet:dev"
	defaultPATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	imageRecipe = 1 // part of every image's cache key: bump when Build's output changes
)

// agnhost's porter serves TLS with these (upstream ADDs them to /): the
// test certificate of k8s.io/kubernetes test/images/agnhost/porter, SAN
// 127.0.0.1 and ::1, valid until 2084.
var (
	//go:embed porter/localhost.crt
	porterCrt []byte
	//go:embed porter/localhost.key
	porterKey []byte
)

// Inputs are the files the lab's images are made of.
type Inputs struct {
	// Root is the Debian root (E2EDebian).
	Root Root
	// Agnhost is the agnhost binary (hack/build-k8s.sh agnhost).
	Agnhost string
	// AgnhostCNP, when set, is the binary of AgnhostCNPRef instead of
	// Agnhost: the same agnhost whose porter stays up when the kernel has
	// no SCTP (hack/build-agnhost-cnp.sh says why and what changes).
	AgnhostCNP string
	// CoreDNS is the coredns binary (hack/build-coredns.sh): agnhost's
	// /coredns, which the DNS spec "should support configurable pod
	// resolv.conf" runs.
	CoreDNS string
	// EchoBasic, when set, is the echo-basic binary
	// (hack/build-echo-basic.sh): the echo-basic images are made only then.
	EchoBasic string
	// FlatnetBin holds flatnet, flatnet-cni and flatnet-pause (bin/
	// after make build).
	FlatnetBin string
	// BusyboxApplets are the names `busybox --list` prints.
	BusyboxApplets []string
	// RootLacks are the busybox applets the root has no command of that
	// name for, as image paths (/usr/bin/wget): see rootLacks.
	RootLacks []string
}

// E2ESpecs are the images a lab with real nodes imports: the sandbox, the
// e2e suite's sig-network images under their upstream names, the Gateway
// API conformance suite's backends, and flatnet's own. Upstream's defaults are kept where a spec can see them
// (entrypoint and command, agnhost's extra files, nginx in the foreground
// on port 80).
func E2ESpecs(in Inputs) []Spec {
	busybox := filepath.Join(in.Root.Dir, "bin/busybox")
	bb := []File{
		{Path: "/bin/busybox", Mode: 0o755, Source: busybox},
		{Path: "/etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{Path: "/etc/group", Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/root", Dir: true, Mode: 0o700},
		{Path: "/home", Dir: true},
	}
	for _, a := range in.BusyboxApplets {
		if a != "busybox" {
			bb = append(bb, File{Path: "/bin/" + a, Link: "busybox", Mode: 0o777})
		}
	}
	agnhost := func(ref, bin string) Spec {
		files := []File{
			{Path: "/agnhost", Mode: 0o755, Source: bin},
			{Path: "/agnhost-2", Link: "agnhost", Mode: 0o777},
			{Path: "/coredns", Mode: 0o755, Source: in.CoreDNS},
			{Path: "/localhost.crt", Data: porterCrt},
			{Path: "/localhost.key", Data: porterKey, Mode: 0o600},
			{Path: "/uploads", Dir: true},
		}
		// Upstream's agnhost is Alpine: every busybox applet that no package
		// replaced is there, and specs run some (the Services specs' `wget -q
		// -O - -T 1`). Debian's tools stay where the root has them (bash
		// too: the CNP suite's containers run `/bin/bash -c "/agnhost ..."`).
		for _, p := range in.RootLacks {
			files = append(files, File{Path: p, Link: "/bin/busybox", Mode: 0o777})
		}
		return Spec{
			Ref:        ref,
			Base:       in.Root.Layer,
			Files:      files,
			Entrypoint: []string{"/agnhost"},
			Cmd:        []string{"pause"}, // a container with no command keeps running
			Env:        []string{defaultPATH},
		}
	}
	cnpBin := in.Agnhost
	if in.AgnhostCNP != "" {
		cnpBin = in.AgnhostCNP
	}
	specs := []Spec{
		Pause(filepath.Join(in.FlatnetBin, "flatnet-pause")),
		agnhost(AgnhostRef, in.Agnhost),
		agnhost(AgnhostCNPRef, cnpBin),
		// Upstream is debian:bookworm-slim with dnsutils: the root as is.
		{Ref: GlibcDNSRef, Base: in.Root.Layer, Cmd: []string{"bash"}, Env: []string{defaultPATH}},
		{Ref: BusyboxRef, Files: bb, Cmd: []string{"sh"}, Env: []string{defaultPATH}},
		{
			Ref:  NginxRef,
			Base: in.Root.Layer,
			Files: []File{
				// Upstream's image logs to the container's output.
				{Path: "/var/log/nginx/access.log", Link: "/dev/stdout", Mode: 0o777},
				{Path: "/var/log/nginx/error.log", Link: "/dev/stderr", Mode: 0o777},
				// Debian's default site also listens on [::]:80, which
				// fails in a pod without IPv6; upstream's entrypoint adds
				// that listener only when IPv6 is there. The lab is IPv4.
				{Path: "/etc/nginx/sites-enabled/default", Data: []byte(nginxSite)},
			},
			Cmd: []string{"nginx", "-g", "daemon off;"},
			Env: []string{defaultPATH},
		},
		{
			Ref:  FlatnetRef,
			Base: in.Root.Layer,
			Files: []File{
				{Path: "/usr/local/bin/flatnet", Mode: 0o755, Source: filepath.Join(in.FlatnetBin, "flatnet")},
				{Path: "/usr/local/bin/flatnet-cni", Mode: 0o755, Source: filepath.Join(in.FlatnetBin, "flatnet-cni")},
			},
			Entrypoint: []string{"/usr/local/bin/flatnet"},
			Env:        []string{defaultPATH},
		},
		// Upstream's is the coredns binary alone, entrypoint /coredns; the
		// suite's Deployment passes -conf /root/Corefile (a ConfigMap).
		{Ref: CoreDNSRef, Files: []File{{Path: "/coredns", Mode: 0o755, Source: in.CoreDNS}}, Entrypoint: []string{"/coredns"}},
	}
	if in.EchoBasic != "" {
		// Upstream's (docker/Dockerfile.echo-basic) is the static binary
		// on distroless, entrypoint /echo-basic; the suite's Deployments
		// give it no command, only POD_NAME, NAMESPACE and TLS_* variables.
		for _, ref := range []string{EchoBasicRef, EchoBasicDevRef} {
			specs = append(specs, Spec{Ref: ref, Files: []File{{Path: "/echo-basic", Mode: 0o755, Source: in.EchoBasic}},
				Entrypoint: []string{"/echo-basic"}, Env: []string{defaultPATH}})
		}
	}
	return specs
}

const nginxSite = `server {
	listen 80 default_server;
	root /var/www/html;
	index index.html index.htm index.nginx-debian.html;
	server_name _;
	location / {
		try_files $uri $uri/ =404;
	}
}
`

// Config says where E2E finds its inputs and keeps its output.
type Config struct {
	// CacheDir holds the Debian root and the tarballs (DefaultCacheDir).
	CacheDir string
	// Agnhost, AgnhostCNP (optional), CoreDNS, EchoBasic (optional) and
	// FlatnetBin: see Inputs.
	Agnhost    string
	AgnhostCNP string
	CoreDNS    string
	EchoBasic  string
	FlatnetBin string
	// Mirror is the Debian archive (DefaultMirror when empty).
	Mirror string
	// Log gets progress lines (nothing when nil).
	Log io.Writer
}

// DefaultCacheDir is ${FLATNET_CACHE:-$HOME/.cache/flatnet}/images,
// beside hack/build-k8s.sh's k8s-<version>/bin.
func DefaultCacheDir() (string, error) {
	k8sBin, err := controlplane.CacheBinDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(filepath.Dir(k8sBin)), "images"), nil
}

// Tarball is one image written for `ctr -n k8s.io images import`.
type Tarball struct {
	Ref  string
	Path string
	Size int64
	// Cached is true when the tarball was already there for the same
	// inputs; Took is how long this call spent on it either way.
	Cached bool
	Took   time.Duration
}

// E2E builds (or finds in the cache) the Debian root and every image of
// E2ESpecs, one docker-archive tarball each. An image is rebuilt only when
// its inputs changed (file contents, names, config): a second call with
// the same inputs hashes them and returns. Calls are serialized by a lock
// in the cache directory.
func E2E(ctx context.Context, cfg Config) ([]Tarball, error) {
	log := cfg.Log
	if log == nil {
		log = io.Discard
	}
	inputs := []struct{ path, hint string }{
		{cfg.Agnhost, "run `hack/build-k8s.sh agnhost`"},
		{cfg.CoreDNS, "run `hack/build-coredns.sh`"},
		{filepath.Join(cfg.FlatnetBin, "flatnet"), "run `make build`"},
		{filepath.Join(cfg.FlatnetBin, "flatnet-cni"), "run `make build`"},
		{filepath.Join(cfg.FlatnetBin, "flatnet-pause"), "run `make build`"},
	}
	if cfg.AgnhostCNP != "" {
		inputs = append(inputs, struct{ path, hint string }{cfg.AgnhostCNP, "run `hack/build-agnhost-cnp.sh`"})
	}
	if cfg.EchoBasic != "" {
		inputs = append(inputs, struct{ path, hint string }{cfg.EchoBasic, "run `hack/build-echo-basic.sh`"})
	}
	for _, p := range inputs {
		if st, err := os.Stat(p.path); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("image input %s not found: %s", p.path, p.hint)
		}
	}
	unlock, err := dirlock.Lock(cfg.CacheDir, func() { fmt.Fprintf(log, "waiting for another image build in %s\n", cfg.CacheDir) })
	if err != nil {
		return nil, err
	}
	defer unlock()

	root, err := E2EDebian.Ensure(ctx, cfg.CacheDir, cfg.Mirror, log)
	if err != nil {
		return nil, err
	}
	if root.Built {
		fmt.Fprintf(log, "Debian root built in %s: %s\n", root.Took.Round(time.Second), root.Dir)
	}
	applets, err := busyboxApplets(ctx, filepath.Join(root.Dir, "bin/busybox"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, a := range applets {
		names = append(names, path.Base(a))
	}
	specs := E2ESpecs(Inputs{
		Root: root, Agnhost: cfg.Agnhost, AgnhostCNP: cfg.AgnhostCNP, CoreDNS: cfg.CoreDNS, EchoBasic: cfg.EchoBasic, FlatnetBin: cfg.FlatnetBin,
		BusyboxApplets: names, RootLacks: rootLacks(root.Dir, applets),
	})
	h := hasher{}
	var out []Tarball
	for _, s := range specs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t, err := buildCached(cfg.CacheDir, s, h)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// buildCached writes s to its tarball unless the tarball's key file says
// it holds the same inputs.
func buildCached(dir string, s Spec, h hasher) (Tarball, error) {
	start := time.Now()
	t := Tarball{Ref: s.Ref, Path: filepath.Join(dir, tarballName(s.Ref))}
	key, err := h.key(s)
	if err != nil {
		return t, fmt.Errorf("image %s: %w", s.Ref, err)
	}
	keyFile := t.Path + ".key"
	if old, err := os.ReadFile(keyFile); err == nil && string(old) == key {
		if st, err := os.Stat(t.Path); err == nil {
			t.Size, t.Cached, t.Took = st.Size(), true, time.Since(start)
			return t, nil
		}
	}
	img, err := Build(s)
	if err != nil {
		return t, err
	}
	os.Remove(keyFile) // a crash between the two writes must not pair an old key with a new file
	if err := Write(t.Path, map[string]v1.Image{s.Ref: img}); err != nil {
		return t, err
	}
	if err := os.WriteFile(keyFile, []byte(key), 0o644); err != nil {
		return t, err
	}
	st, err := os.Stat(t.Path)
	if err != nil {
		return t, err
	}
	t.Size, t.Took = st.Size(), time.Since(start)
	return t, nil
}

// tarballName is the file name of ref's tarball: its last path element
// and tag (agnhost-2.66.1.tar, flatnet-dev.tar).
func tarballName(ref string) string {
	base := ref[strings.LastIndex(ref, "/")+1:]
	return strings.ReplaceAll(base, ":", "-") + ".tar"
}

// hasher computes cache keys; it remembers file digests so a base layer
// shared by several images is read once per call.
type hasher map[string]string

func (h hasher) file(p string) (string, error) {
	if d, ok := h[p]; ok {
		return d, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := sha256.New()
	if _, err := io.Copy(s, f); err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	h[p] = hex.EncodeToString(s.Sum(nil))
	return h[p], nil
}

// key is the digest of everything Build's output depends on: s with each
// file named by content instead of by where it is on this machine.
func (h hasher) key(s Spec) (string, error) {
	type file struct {
		File
		Content string
	}
	k := struct {
		Recipe int
		Spec
		BaseContent string
		Contents    []file
	}{Recipe: imageRecipe, Spec: s}
	k.Files, k.Base = nil, ""
	if s.Base != "" {
		d, err := h.file(s.Base)
		if err != nil {
			return "", err
		}
		k.BaseContent = d
	}
	for _, f := range s.Files {
		c := file{File: f}
		if f.Source != "" {
			d, err := h.file(f.Source)
			if err != nil {
				return "", err
			}
			c.Source, c.Content = "", d
		}
		k.Contents = append(k.Contents, c)
	}
	b, err := json.Marshal(k)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// busyboxApplets runs the root's static busybox for the applets it has,
// each where busybox would install it (usr/bin/wget, sbin/ifconfig). The
// busybox image links each name to it, as upstream's does.
func busyboxApplets(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets (%s): %w", bin, err)
	}
	applets := strings.Fields(string(out))
	if len(applets) == 0 {
		return nil, fmt.Errorf("%s --list-full printed no applet", bin)
	}
	return applets, nil
}

// pathDirs are defaultPATH's directories.
var pathDirs = strings.Split(strings.TrimPrefix(defaultPATH, "PATH="), ":")

// rootLacks returns the applets (busyboxApplets' paths) that rootDir has
// no command of the same name for in any PATH directory, as absolute image
// paths with the root's merged /usr applied (bin/ping is /usr/bin/ping
// when /bin links to usr/bin, so no layer entry lies below a link).
// Applets outside a directory (linuxrc) are left out.
func rootLacks(rootDir string, applets []string) []string {
	var lacks []string
	for _, a := range applets {
		dir, name := path.Split(a)
		if dir == "" {
			continue
		}
		have := false
		for _, d := range append([]string{dir}, pathDirs...) {
			if _, err := os.Lstat(filepath.Join(rootDir, merged(rootDir, d), name)); err == nil {
				have = true
				break
			}
		}
		if !have {
			lacks = append(lacks, "/"+path.Join(merged(rootDir, dir), name))
		}
	}
	return lacks
}

// merged is dir (relative or absolute, inside rootDir) with its first
// element replaced by what it links to in rootDir (bin -> usr/bin), as a
// path relative to rootDir. Only a link inside the root is followed.
func merged(rootDir, dir string) string {
	dir = strings.Trim(path.Clean("/"+dir), "/")
	first, rest, _ := strings.Cut(dir, "/")
	target, err := os.Readlink(filepath.Join(rootDir, first))
	if err != nil {
		return dir
	}
	return strings.TrimPrefix(path.Join("/", target, rest), "/")
}
