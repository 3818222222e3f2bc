// Package envoy is the end-to-end suite of the shipped Envoy configs
// (deploy/envoy) run by the real, pinned Envoy (scripts/pyenv.sh envoy):
// each test starts Envoy on a shipped file with its addresses moved to
// 127.0.0.1 (internal/testutil/envoytest), the EPP assembled in process
// (epp) and simulated replicas (engines/sim) behind recording fronts that
// see what Envoy sent upstream, and checks one behaviour the configs'
// comments promise. go test ./e2e/envoy/... runs it alone.
package envoy
