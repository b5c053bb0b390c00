package controlplane

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var testNames = apiserverNames(netip.MustParseAddr("10.250.0.1"), netip.MustParseAddr("10.96.0.1"))

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func snapshot(t *testing.T, p PKI) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	for _, f := range []string{p.CACert(), p.CAKey(), p.APIServerCert(), p.APIServerKey(), p.AdminCert(), p.AdminKey(), p.ServiceAccountKey(), p.ServiceAccountPub(),
		p.EtcdCACert(), p.EtcdCAKey(), p.EtcdServerCert(), p.EtcdServerKey(), p.EtcdClientCert(), p.EtcdClientKey()} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m[filepath.Base(f)] = b
	}
	return m
}

func changedFiles(a, b map[string][]byte) []string {
	var out []string
	for k := range a {
		if !bytes.Equal(a[k], b[k]) {
			out = append(out, k)
		}
	}
	return out
}

func TestPKIFresh(t *testing.T) {
	p := PKI{Dir: filepath.Join(t.TempDir(), "pki")}
	// As labs before made it: made private now.
	if err := os.Mkdir(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	changed, err := ensurePKI(p, testNames, now)
	if err != nil || len(changed) != 20 {
		t.Fatalf("ensurePKI = %v, %v; want all 20 files", changed, err)
	}
	ca := readCert(t, p.CACert())
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	srv := readCert(t, p.APIServerCert())
	for _, name := range []string{"10.250.0.1", "127.0.0.1", "10.96.0.1", "localhost", "kubernetes", "kubernetes.default",
		"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} {
		if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("serving cert for %s: %v", name, err)
		}
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.250.0.2"}); err == nil {
		t.Error("serving cert valid for an address it should not name")
	}

	adm := readCert(t, p.AdminCert())
	if _, err := adm.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin cert: %v", err)
	}
	if adm.Subject.CommonName != "flatnet-admin" || len(adm.Subject.Organization) != 1 || adm.Subject.Organization[0] != "system:masters" {
		t.Errorf("admin subject %s", adm.Subject)
	}
	for _, c := range []struct {
		cert, cn, org string
	}{
		{p.ControllerManagerCert(), "system:kube-controller-manager", ""},
		{p.SchedulerCert(), "system:kube-scheduler", ""},
		{p.KubeletClientCert(), "kube-apiserver-kubelet-client", "system:masters"},
	} {
		cert := readCert(t, c.cert)
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: %v", c.cert, err)
		}
		if cert.Subject.CommonName != c.cn || strings.Join(cert.Subject.Organization, ",") != c.org {
			t.Errorf("%s: subject %s, want CN=%s O=%s", c.cert, cert.Subject, c.cn, c.org)
		}
	}
	for _, f := range []string{p.CAKey(), p.APIServerKey(), p.AdminKey(), p.ControllerManagerKey(), p.SchedulerKey(), p.KubeletClientKey(),
		p.ServiceAccountKey(), p.EtcdCAKey(), p.EtcdServerKey(), p.EtcdClientKey()} {
		st, err := os.Stat(f)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", f, st.Mode().Perm(), err)
		}
	}
	if st, err := os.Stat(p.Dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("%s: mode %v (%v), want 0700", p.Dir, st.Mode().Perm(), err)
	}

	// etcd's certificates come from a CA of their own: the admin
	// certificate (the apiserver's CA) must not open etcd.
	etcdCA := readCert(t, p.EtcdCACert())
	if bytes.Equal(etcdCA.Raw, ca.Raw) {
		t.Fatal("etcd shares the lab CA")
	}
	etcdPool := x509.NewCertPool()
	etcdPool.AddCert(etcdCA)
	if _, err := adm.Verify(x509.VerifyOptions{Roots: etcdPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the admin certificate is valid for etcd")
	}
	es := readCert(t, p.EtcdServerCert())
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} { // serving and peer
		if _, err := es.Verify(x509.VerifyOptions{Roots: etcdPool, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("etcd serving cert, usage %v: %v", u, err)
		}
	}
	if _, err := es.Verify(x509.VerifyOptions{Roots: etcdPool, DNSName: "10.250.0.1"}); err == nil {
		t.Error("etcd serving cert valid off loopback")
	}
	ec := readCert(t, p.EtcdClientCert())
	if _, err := ec.Verify(x509.VerifyOptions{Roots: etcdPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil || ec.Subject.CommonName != EtcdClientUser {
		t.Errorf("apiserver's etcd client cert %s: %v", ec.Subject, err)
	}
	if _, err := ec.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the etcd client certificate is valid for the apiserver")
	}
	if err := checkSAKeys(p); err != nil {
		t.Error(err)
	}
}

func TestPKIReuseAndRepair(t *testing.T) {
	p := PKI{Dir: filepath.Join(t.TempDir(), "pki")}
	now := time.Now()
	if _, err := ensurePKI(p, testNames, now); err != nil {
		t.Fatal(err)
	}
	orig := snapshot(t, p)

	// Valid: nothing changes.
	changed, err := ensurePKI(p, testNames, now)
	if err != nil || len(changed) != 0 {
		t.Fatalf("second ensurePKI = %v, %v; want no change", changed, err)
	}
	if c := changedFiles(orig, snapshot(t, p)); len(c) != 0 {
		t.Fatalf("files rewritten: %v", c)
	}

	// A new name for the apiserver re-issues only its certificate.
	other := apiserverNames(netip.MustParseAddr("10.250.1.1"), netip.MustParseAddr("10.96.0.1"))
	if changed, err := ensurePKI(p, other, now); err != nil || len(changed) == 0 {
		t.Fatalf("ensurePKI with new SAN = %v, %v", changed, err)
	}
	after := snapshot(t, p)
	if c := changedFiles(orig, after); len(c) != 2 || !bytes.Equal(orig["ca.crt"], after["ca.crt"]) || bytes.Equal(orig["apiserver.crt"], after["apiserver.crt"]) {
		t.Errorf("new SAN changed %v, want apiserver.crt and apiserver.key only", c)
	}
	if err := readCert(t, p.APIServerCert()).VerifyHostname("10.250.1.1"); err != nil {
		t.Error(err)
	}

	// A lab's PKI from before etcd had certificates: only etcd's files are
	// added, the rest is kept (the admin kubeconfig stays valid).
	before := snapshot(t, p)
	etcdFiles := []string{p.EtcdCACert(), p.EtcdCAKey(), p.EtcdServerCert(), p.EtcdServerKey(), p.EtcdClientCert(), p.EtcdClientKey()}
	for _, f := range etcdFiles {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	if changed, err := ensurePKI(p, other, now); err != nil || !slices.Equal(slices.Sorted(slices.Values(changed)), slices.Sorted(slices.Values(etcdFiles))) {
		t.Fatalf("ensurePKI without etcd's files = %v, %v; want %v", changed, err, etcdFiles)
	}
	if c := changedFiles(before, snapshot(t, p)); len(c) != 6 {
		t.Errorf("adding etcd's files changed %v", c)
	}

	// A broken admin key re-issues the admin certificate.
	if err := os.WriteFile(p.AdminKey(), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := ensurePKI(p, other, now); err != nil || len(changed) == 0 {
		t.Fatalf("ensurePKI with broken admin key = %v, %v", changed, err)
	}
	if _, _, err := loadCertKey(p.AdminCert(), p.AdminKey()); err != nil {
		t.Errorf("admin pair after repair: %v", err)
	}

	// A mismatched service-account pair is made again.
	if err := os.Remove(p.ServiceAccountPub()); err != nil {
		t.Fatal(err)
	}
	if changed, err := ensurePKI(p, other, now); err != nil || len(changed) == 0 {
		t.Fatalf("ensurePKI without sa.pub = %v, %v", changed, err)
	}
	if err := checkSAKeys(p); err != nil {
		t.Error(err)
	}

	// Close to expiry (a year on): leaves are re-issued under the same CA.
	before = snapshot(t, p)
	later := now.Add(leafValidity - renewBefore/2)
	if changed, err := ensurePKI(p, other, later); err != nil || len(changed) == 0 {
		t.Fatalf("ensurePKI near expiry = %v, %v", changed, err)
	}
	after = snapshot(t, p)
	if !bytes.Equal(before["ca.crt"], after["ca.crt"]) || bytes.Equal(before["admin.crt"], after["admin.crt"]) || bytes.Equal(before["apiserver.crt"], after["apiserver.crt"]) {
		t.Error("near expiry: want new leaves under the same CA")
	}

	// A new CA (the old one removed) re-issues both leaves.
	if err := os.Remove(p.CAKey()); err != nil {
		t.Fatal(err)
	}
	before = after
	if changed, err := ensurePKI(p, other, now); err != nil || len(changed) == 0 {
		t.Fatalf("ensurePKI without CA key = %v, %v", changed, err)
	}
	after = snapshot(t, p)
	for _, f := range []string{"ca.crt", "apiserver.crt", "admin.crt"} {
		if bytes.Equal(before[f], after[f]) {
			t.Errorf("new CA: %s not re-issued", f)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, p.CACert()))
	if _, err := readCert(t, p.AdminCert()).Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("admin cert under the new CA: %v", err)
	}
}
