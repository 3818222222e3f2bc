// Package clustertest holds the tests of deploy/ against a real
// kube-apiserver and etcd (internal/testutil/kubetest): every value combination
// deploy/check.sh renders (deploy/helm/ci/renders.txt) is admitted by the
// API server; the EPP runs with exactly the Role the chart renders, and
// fails naming the verb when any one is missing; the quoter needs and gets
// no API access; install.sh installs, re-installs and installs a second
// environment, with the signing key in no argv, environment, log, Helm
// release or ConfigMap. The package has no non-test code.
package clustertest
