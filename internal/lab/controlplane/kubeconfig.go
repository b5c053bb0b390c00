package controlplane

import (
	"fmt"
	"os"

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
