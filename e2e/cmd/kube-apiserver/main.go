// Command kube-apiserver is the real Kubernetes API server, built from the
// k8s.io/kubernetes module so that e2e runs need no container runtime.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
