package controlplane

// The lab's PKI, made with crypto/x509 (no openssl): one CA signs the
// apiserver's serving certificate and the admin client certificate; the
// service-account key pair signs and verifies service-account tokens.
// Files live in <state>/pki and are reused while they are valid; whatever
// is missing, broken, expiring or (for the serving certificate) lacking a
// required name is made again. A new CA re-issues every certificate.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
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
)

// PKI names the files in <state>/pki.
type PKI struct{ Dir string }

func (p PKI) path(n string) string      { return filepath.Join(p.Dir, n) }
func (p PKI) CACert() string            { return p.path("ca.crt") }
func (p PKI) CAKey() string             { return p.path("ca.key") }
func (p PKI) APIServerCert() string     { return p.path("apiserver.crt") }
func (p PKI) APIServerKey() string      { return p.path("apiserver.key") }
func (p PKI) AdminCert() string         { return p.path("admin.crt") }
func (p PKI) AdminKey() string          { return p.path("admin.key") }
func (p PKI) ServiceAccountKey() string { return p.path("sa.key") }
func (p PKI) ServiceAccountPub() string { return p.path("sa.pub") }

// servingNames are the SANs of the apiserver's serving certificate.
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

// ensurePKI makes sure every file of the PKI exists and is valid for names,
// creating what is not. It reports whether anything was written.
func ensurePKI(p PKI, names servingNames, now time.Time) (changed bool, err error) {
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return false, fmt.Errorf("creating %s: %w", p.Dir, err)
	}
	ca, caKey, err := loadCA(p, now)
	if err != nil {
		ca, caKey, err = newCA(now)
		if err != nil {
			return false, err
		}
		if err := writeCertKey(p.CACert(), p.CAKey(), ca, caKey); err != nil {
			return false, err
		}
		changed = true
		// Everything the old CA signed is now useless.
		for _, f := range []string{p.APIServerCert(), p.AdminCert()} {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return true, err
			}
		}
	}

	leaves := []struct {
		cert, key string
		tmpl      func() *x509.Certificate
		valid     func(*x509.Certificate) error
	}{
		{p.APIServerCert(), p.APIServerKey(),
			func() *x509.Certificate { return servingTemplate(names, now) },
			func(c *x509.Certificate) error { return checkServing(c, ca, names, now) }},
		{p.AdminCert(), p.AdminKey(),
			func() *x509.Certificate { return adminTemplate(now) },
			func(c *x509.Certificate) error { return checkAdmin(c, ca, now) }},
	}
	for _, l := range leaves {
		if c, _, err := loadCertKey(l.cert, l.key); err == nil && l.valid(c) == nil {
			continue
		}
		c, k, err := issue(l.tmpl(), ca, caKey)
		if err != nil {
			return true, err
		}
		if err := writeCertKey(l.cert, l.key, c, k); err != nil {
			return true, err
		}
		changed = true
	}

	if err := checkSAKeys(p); err != nil {
		k, err := newKey()
		if err != nil {
			return true, err
		}
		pub, err := x509.MarshalPKIXPublicKey(k.Public())
		if err != nil {
			return true, err
		}
		if err := writeKey(p.ServiceAccountKey(), k); err != nil {
			return true, err
		}
		if err := writeFile(p.ServiceAccountPub(), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
			return true, err
		}
		changed = true
	}
	return changed, nil
}

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

func newCA(now time.Time) (*x509.Certificate, crypto.Signer, error) {
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
		Subject:               pkix.Name{CommonName: "flatnet-lab-ca"},
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

func servingTemplate(n servingNames, now time.Time) *x509.Certificate {
	var ips []net.IP
	for _, ip := range n.IPs {
		ips = append(ips, net.IP(ip.AsSlice()))
	}
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: ips,
		DNSNames:    n.DNS,
	}
}

func adminTemplate(now time.Time) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: AdminUser, Organization: []string{AdminGroup}},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(leafValidity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
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

func loadCA(p PKI, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	c, k, err := loadCertKey(p.CACert(), p.CAKey())
	if err != nil {
		return nil, nil, err
	}
	if !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, fmt.Errorf("%s is not a CA certificate", p.CACert())
	}
	if now.Add(renewBefore).After(c.NotAfter) || now.Before(c.NotBefore) {
		return nil, nil, fmt.Errorf("%s is expired or expiring", p.CACert())
	}
	return c, k, nil
}

func verify(c, ca *x509.Certificate, usage x509.ExtKeyUsage, now time.Time) error {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return err
	}
	if now.Add(renewBefore).After(c.NotAfter) {
		return fmt.Errorf("expires %s", c.NotAfter.Format(time.RFC3339))
	}
	return nil
}

func checkServing(c, ca *x509.Certificate, n servingNames, now time.Time) error {
	if err := verify(c, ca, x509.ExtKeyUsageServerAuth, now); err != nil {
		return err
	}
	for _, ip := range n.IPs {
		if err := c.VerifyHostname(ip.String()); err != nil {
			return err
		}
	}
	for _, d := range n.DNS {
		if err := c.VerifyHostname(d); err != nil {
			return err
		}
	}
	return nil
}

func checkAdmin(c, ca *x509.Certificate, now time.Time) error {
	if err := verify(c, ca, x509.ExtKeyUsageClientAuth, now); err != nil {
		return err
	}
	if c.Subject.CommonName != AdminUser || !slices.Equal(c.Subject.Organization, []string{AdminGroup}) {
		return fmt.Errorf("admin certificate subject is %q, want CN=%s O=%s", c.Subject, AdminUser, AdminGroup)
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
