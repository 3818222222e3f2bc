// Package envoy owns the Envoy bootstraps that run the EPP as an ext_proc
// sidecar (envoy.yaml, and envoy-two-epps.yaml with two EPP hosts). It has
// no code of its own; its test checks that they parse as Envoy's v3 API and
// say what the EndpointPicker protocol needs.
package envoy
