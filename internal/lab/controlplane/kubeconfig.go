package controlplane

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// kubeconfig renders the admin kubeconfig with the CA and the admin client
// certificate embedded, so the file works when copied elsewhere. The
// output is deterministic: an unchanged PKI gives the same bytes.
func kubeconfig(name, server string, p PKI) ([]byte, error) {
	return kubeconfigFor(name, server, p, AdminUser, p.AdminCert(), p.AdminKey())
}

// kubeconfigFor renders a kubeconfig for user with the client certificate
// certFile/keyFile embedded.
func kubeconfigFor(name, server string, p PKI, user, certFile, keyFile string) ([]byte, error) {
	read := func(path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	ca, err := read(p.CACert())
	if err != nil {
		return nil, err
	}
	cert, err := read(certFile)
	if err != nil {
		return nil, err
	}
	key, err := read(keyFile)
	if err != nil {
		return nil, err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user}
	cfg.CurrentContext = name
	return clientcmd.Write(*cfg)
}

// Client returns a clientset for the kubeconfig file at path.
func Client(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	// The lab creates and deletes pods in bursts; the default 5 QPS would
	// throttle it.
	rc.QPS, rc.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", kubeconfig, err)
	}
	return cs, nil
}

// NodeKubeconfig writes, at path, the kubeconfig of node's kubelet: a
// client certificate of the lab CA for system:node:<node> in
// system:nodes (what the Node authorizer and NodeRestriction admission
// expect), kept beside it (<path>.crt, .key) and re-issued only when
// missing, expiring or signed by another CA. The control plane must have
// been brought up (its record names the server).
func NodeKubeconfig(stateDir, clusterName, node, path string) error {
	rec, err := loadRecord(stateDir)
	if err != nil {
		return err
	}
	if rec == nil {
		return fmt.Errorf("control plane: no %s: bring the control plane up first", recordPath(stateDir))
	}
	p := PKI{Dir: PKIDir(stateDir)}
	now := time.Now()
	ca, caKey, err := loadCA(p.CACert(), p.CAKey(), now)
	if err != nil {
		return fmt.Errorf("control plane: lab CA: %w", err)
	}
	user := "system:node:" + node
	l := leaf{cert: path + ".crt", key: path + ".key", subject: pkix.Name{CommonName: user, Organization: []string{"system:nodes"}},
		usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if c, _, err := loadCertKey(l.cert, l.key); err != nil || l.check(c, ca, now) != nil {
		c, k, err := issue(l.template(now), ca, caKey)
		if err != nil {
			return err
		}
		if err := writeCertKey(l.cert, l.key, c, k); err != nil {
			return err
		}
	}
	data, err := kubeconfigFor(clusterName, rec.server(), p, user, l.cert, l.key)
	if err != nil {
		return err
	}
	return writeFile(path, data, 0o600)
}
