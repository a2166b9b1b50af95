// Package netpol runs Kubernetes' own NetworkPolicy conformance tests, the `[sig-network] Netpol` suite of
// k8s.io/kubernetes/test/e2e/network/netpol at the pinned version, and nothing else of the e2e tree: importing the
// suite registers its specs; TestMain wires the e2e framework's flags as test/e2e/e2e_test.go does. Built by
// `sh scripts/k8s.sh netpol` into the binaries' cache; run by `sh scripts/netpol-e2e.sh` against a lab cluster.
package netpol

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	_ "k8s.io/kubernetes/test/e2e/network/netpol"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestNetpol(t *testing.T) {
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Netpol", suiteConfig, reporterConfig)
}
