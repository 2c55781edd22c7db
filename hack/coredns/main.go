// CoreDNS with only the plugins a one-node test cluster needs: cluster DNS for Services (kubernetes),
// a readiness endpoint the harness waits for (ready), bind and errors. CoreDNS's documented way to
// choose plugins at compile time: import them and set dnsserver.Directives, in plugin.cfg's order.
// Without the cloud plugins (route53, azure, clouddns, ...) the build takes a fraction of the time.
// hack/build-coredns.sh builds it; the version is pinned in go.mod (the one kubeadm v1.34 installs).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
