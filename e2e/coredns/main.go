// Command coredns is CoreDNS with only the plugins the e2e suite needs: the
// kubernetes plugin, which serves the e2e control plane's Services; bind,
// for the address in the test network namespace; errors and log, for the
// suite's logs; and ready, which says when the kubernetes plugin has synced
// with the API server. It is its own module, so that CoreDNS's
// dependencies do not move the versions the control plane is built with.
//
//	coredns -conf Corefile
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives is the order the plugins handle a query in, as in CoreDNS's
// own plugin.cfg: no cache, so that a change shows at the next query.
var directives = []string{"bind", "ready", "errors", "log", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
