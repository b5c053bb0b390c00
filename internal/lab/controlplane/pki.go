package controlplane

// The lab's PKI, made with crypto/x509 (no openssl). Two CAs:
//
//   - the lab CA signs the apiserver's serving certificate and the client
//     certificates of the admin, kube-controller-manager, kube-scheduler
//     and the apiserver towards kubelets; the apiserver trusts it for
//     client certificates (--client-ca-file), kubelets too;
//   - the etcd CA signs etcd's serving certificate (also its peer
//     certificate) and the apiserver's etcd client certificate; etcd
//     trusts only it (--client-cert-auth, --trusted-ca-file).
//
// Two CAs, as kubeadm does, so that no certificate the apiserver accepts
// (the admin's, embedded in a kubeconfig that may be copied around) opens
// etcd, where the apiserver's authorization does not apply. The
// service-account key pair signs and verifies service-account tokens.
//
// Files live in <state>/pki (0700, keys 0600) and are reused while they are
// valid; whatever is missing, broken, expiring or lacking a required name
// or subject is made again. A new CA re-issues every certificate it signs.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/flatnet/flatnet/internal/atomicfile"
)

const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// renewBefore: a certificate expiring sooner than this is re-issued.
	renewBefore = 30 * 24 * time.Hour

	// AdminUser and AdminGroup are the admin client certificate's CN and O.
	AdminUser  = "flatnet-admin"
	AdminGroup = "system:masters"
	// EtcdClientUser is the CN of the apiserver's etcd client certificate.
	EtcdClientUser = "kube-apiserver-etcd-client"
	// ControllerManagerUser and SchedulerUser are the users the bootstrap
	// RBAC policy binds the controller manager's and the scheduler's roles
	// to.
	ControllerManagerUser = "system:kube-controller-manager"
	SchedulerUser         = "system:kube-scheduler"
	// KubeletClientUser is the apiserver's identity towards kubelets
	// (exec, logs, port-forward, pods/proxy): a lab admin, as kubeadm's
	// apiserver-kubelet-client is.
	KubeletClientUser = "kube-apiserver-kubelet-client"
)

// PKI names the files in <state>/pki.
type PKI struct{ Dir string }

// PKIDir is the directory of a lab's certificates and keys.
func PKIDir(stateDir string) string { return filepath.Join(stateDir, "pki") }

func (p PKI) path(n string) string          { return filepath.Join(p.Dir, n) }
func (p PKI) CACert() string                { return p.path("ca.crt") }
func (p PKI) CAKey() string                 { return p.path("ca.key") }
func (p PKI) APIServerCert() string         { return p.path("apiserver.crt") }
func (p PKI) APIServerKey() string          { return p.path("apiserver.key") }
func (p PKI) AdminCert() string             { return p.path("admin.crt") }
func (p PKI) AdminKey() string              { return p.path("admin.key") }
func (p PKI) ServiceAccountKey() string     { return p.path("sa.key") }
func (p PKI) ServiceAccountPub() string     { return p.path("sa.pub") }
func (p PKI) EtcdCACert() string            { return p.path("etcd-ca.crt") }
func (p PKI) EtcdCAKey() string             { return p.path("etcd-ca.key") }
func (p PKI) EtcdServerCert() string        { return p.path("etcd-server.crt") }
func (p PKI) EtcdServerKey() string         { return p.path("etcd-server.key") }
func (p PKI) EtcdClientCert() string        { return p.path("apiserver-etcd-client.crt") }
func (p PKI) EtcdClientKey() string         { return p.path("apiserver-etcd-client.key") }
func (p PKI) ControllerManagerCert() string { return p.path("controller-manager.crt") }
func (p PKI) ControllerManagerKey() string  { return p.path("controller-manager.key") }
func (p PKI) SchedulerCert() string         { return p.path("scheduler.crt") }
func (p PKI) SchedulerKey() string          { return p.path("scheduler.key") }
func (p PKI) KubeletClientCert() string     { return p.path("apiserver-kubelet-client.crt") }
func (p PKI) KubeletClientKey() string      { return p.path("apiserver-kubelet-client.key") }

// etcdFiles are the files etcd reads: when one changes, etcd restarts.
func (p PKI) etcdFiles() []string {
	return []string{p.EtcdCACert(), p.EtcdServerCert(), p.EtcdServerKey()}
}

// servingNames are the SANs of a serving certificate.
type servingNames struct {
	IPs []netip.Addr
	DNS []string
}

func apiserverNames(addr netip.Addr, serviceIP netip.Addr) servingNames {
	ips := []netip.Addr{addr}
	for _, ip := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), serviceIP} {
		if !slices.Contains(ips, ip) {
			ips = append(ips, ip)
		}
	}
	return servingNames{
		IPs: ips,
		DNS: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
}

// etcdNames: etcd listens on loopback only.
var etcdNames = servingNames{IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, DNS: []string{"localhost"}}

// leaf is a certificate the PKI keeps: its files and what it must say.
type leaf struct {
	cert, key string
	subject   pkix.Name
	usages    []x509.ExtKeyUsage
	names     servingNames // SANs (serving certificates)
}

// authority is a CA and the certificates it signs.
type authority struct {
	cert, key, cn string
	leaves        []leaf
}

func (p PKI) authorities(apiserver servingNames) []authority {
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return []authority{
		{cert: p.CACert(), key: p.CAKey(), cn: "flatnet-lab-ca", leaves: []leaf{
			{p.APIServerCert(), p.APIServerKey(), pkix.Name{CommonName: "kube-apiserver"}, server, apiserver},
			{p.AdminCert(), p.AdminKey(), pkix.Name{CommonName: AdminUser, Organization: []string{AdminGroup}}, client, servingNames{}},
			{p.ControllerManagerCert(), p.ControllerManagerKey(), pkix.Name{CommonName: ControllerManagerUser}, client, servingNames{}},
			{p.SchedulerCert(), p.SchedulerKey(), pkix.Name{CommonName: SchedulerUser}, client, servingNames{}},
			{p.KubeletClientCert(), p.KubeletClientKey(), pkix.Name{CommonName: KubeletClientUser, Organization: []string{AdminGroup}}, client, servingNames{}},
		}},
		{cert: p.EtcdCACert(), key: p.EtcdCAKey(), cn: "flatnet-lab-etcd-ca", leaves: []leaf{
			// Also the peer certificate: a peer is both server and client.
			{p.EtcdServerCert(), p.EtcdServerKey(), pkix.Name{CommonName: "etcd"},
				[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, etcdNames},
			{p.EtcdClientCert(), p.EtcdClientKey(), pkix.Name{CommonName: EtcdClientUser}, client, servingNames{}},
		}},
	}
}

// ensurePKI makes sure every file of the PKI exists and is valid for the
// apiserver's names, creating what is not. It returns the certificate and
// key files it wrote.
func ensurePKI(p PKI, names servingNames, now time.Time) (changed []string, err error) {
	if err := privateDir(p.Dir); err != nil {
		return nil, err
	}
	for _, a := range p.authorities(names) {
		ca, caKey, err := loadCA(a.cert, a.key, now)
		fresh := err != nil
		if fresh {
			if ca, caKey, err = newCA(a.cn, now); err != nil {
				return changed, err
			}
			if err := writeCertKey(a.cert, a.key, ca, caKey); err != nil {
				return changed, err
			}
			changed = append(changed, a.cert, a.key)
		}
		for _, l := range a.leaves {
			// Everything an old CA signed is useless under a new one.
			if c, _, err := loadCertKey(l.cert, l.key); err == nil && !fresh && l.check(c, ca, now) == nil {
				continue
			}
			c, k, err := issue(l.template(now), ca, caKey)
			if err != nil {
				return changed, err
			}
			if err := writeCertKey(l.cert, l.key, c, k); err != nil {
				return changed, err
			}
			changed = append(changed, l.cert, l.key)
		}
	}

	if err := checkSAKeys(p); err != nil {
		k, err := newKey()
		if err != nil {
			return changed, err
		}
		pub, err := x509.MarshalPKIXPublicKey(k.Public())
		if err != nil {
			return changed, err
		}
		if err := writeKey(p.ServiceAccountKey(), k); err != nil {
			return changed, err
		}
		if err := writeFile(p.ServiceAccountPub(), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
			return changed, err
		}
		changed = append(changed, p.ServiceAccountKey(), p.ServiceAccountPub())
	}
	return changed, nil
}

// privateDir makes dir, or makes an existing one, readable by root only
// (labs made before kept their state 0755).
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("making %s private: %w", dir, err)
		}
	}
	return nil
}

// PrivateDir makes a lab's state directory (created if missing) readable
// by root only: it holds the keys, the admin kubeconfig and etcd's data.
func PrivateDir(stateDir string) error { return privateDir(stateDir) }

func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a key: %w", err)
	}
	return k, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newCA(cn string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	k, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	c, err := x509.ParseCertificate(der)
	return c, k, err
}

func (l leaf) template(now time.Time) *x509.Certificate {
	var ips []net.IP
	for _, ip := range l.names.IPs {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return &x509.Certificate{
		Subject:     l.subject,
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: l.usages,
		IPAddresses: ips,
		DNSNames:    l.names.DNS,
	}
}

func issue(tmpl, ca *x509.Certificate, caKey crypto.Signer) (*x509.Certificate, crypto.Signer, error) {
	k, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	if tmpl.SerialNumber, err = serial(); err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, k.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing %q: %w", tmpl.Subject.CommonName, err)
	}
	c, err := x509.ParseCertificate(der)
	return c, k, err
}

func loadCA(certPath, keyPath string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	c, k, err := loadCertKey(certPath, keyPath)
	if err != nil {
		return nil, nil, err
	}
	if !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, fmt.Errorf("%s is not a CA certificate", certPath)
	}
	if now.Add(renewBefore).After(c.NotAfter) || now.Before(c.NotBefore) {
		return nil, nil, fmt.Errorf("%s is expired or expiring", certPath)
	}
	return c, k, nil
}

// check tells why c is not (or no longer) the certificate l wants.
func (l leaf) check(c, ca *x509.Certificate, now time.Time) error {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, u := range l.usages {
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return err
		}
	}
	if now.Add(renewBefore).After(c.NotAfter) {
		return fmt.Errorf("expires %s", c.NotAfter.Format(time.RFC3339))
	}
	if c.Subject.CommonName != l.subject.CommonName || !slices.Equal(c.Subject.Organization, l.subject.Organization) {
		return fmt.Errorf("subject is %q, want %q", c.Subject, l.subject)
	}
	for _, ip := range l.names.IPs {
		if err := c.VerifyHostname(ip.String()); err != nil {
			return err
		}
	}
	for _, d := range l.names.DNS {
		if err := c.VerifyHostname(d); err != nil {
			return err
		}
	}
	return nil
}

func checkSAKeys(p PKI) error {
	k, err := loadKey(p.ServiceAccountKey())
	if err != nil {
		return err
	}
	b, err := os.ReadFile(p.ServiceAccountPub())
	if err != nil {
		return err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return fmt.Errorf("%s: no PUBLIC KEY block", p.ServiceAccountPub())
	}
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return err
	}
	if !k.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(pub) {
		return fmt.Errorf("%s does not match %s", p.ServiceAccountPub(), p.ServiceAccountKey())
	}
	return nil
}

func loadCertKey(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	b, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("%s: no CERTIFICATE block", certPath)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", certPath, err)
	}
	k, err := loadKey(keyPath)
	if err != nil {
		return nil, nil, err
	}
	if !k.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(c.PublicKey) {
		return nil, nil, fmt.Errorf("%s does not match %s", keyPath, certPath)
	}
	return c, k, nil
}

func loadKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PRIVATE KEY block", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: unsupported key type %T", path, k)
	}
	return s, nil
}

func writeCertKey(certPath, keyPath string, c *x509.Certificate, k crypto.Signer) error {
	// Key first: a certificate on disk always has its key beside it.
	if err := writeKey(keyPath, k); err != nil {
		return err
	}
	return writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), 0o644)
}

func writeKey(path string, k crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// writeFile replaces path atomically, and not at all when it already holds
// data (so a reused lab's files keep their times).
func writeFile(path string, data []byte, mode os.FileMode) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return atomicfile.WriteFile(path, data, mode)
}
