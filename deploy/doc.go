// Package deploy owns the deployment assets: the Helm chart and installer,
// the Envoy configs, the systemd units, the Grafana dashboards and the
// Prometheus rules. It has no code of its own; its tests check that the
// assets agree with each other and with the EPP and quoter they deploy.
package deploy
