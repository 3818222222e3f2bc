package envoytest

import (
	"fmt"
	"strings"
)

// Uncomment turns on the block raw carries commented out from the line
// "# key:" on: that line and every "#" line after it at the same
// indentation lose their first "# ", so the block reads as the file's
// comment wrote it. Exactly one such block must be there.
func Uncomment(raw []byte, key string) ([]byte, error) {
	lines := strings.Split(string(raw), "\n")
	found, prefix := 0, ""
	for i, l := range lines {
		if strings.TrimSpace(l) == "# "+key+":" {
			found++
			prefix = l[:strings.IndexByte(l, '#')] + "#"
		} else if prefix == "" || !strings.HasPrefix(l, prefix) {
			prefix = ""
			continue
		}
		lines[i] = strings.Replace(l, "# ", "", 1)
	}
	if found != 1 {
		return nil, fmt.Errorf("%d blocks commented out under %q, want 1", found, key)
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// RouteHeader is the Edit that sets to value every request header named
// key that a route's typed_per_filter_config adds (a header_mutation's
// request_mutations, as omnious.route_headers' example does). No route
// adding it is an error.
func RouteHeader(key, value string) func(doc map[string]any) error {
	return func(doc map[string]any) error {
		n := 0
		var walk func(v any, perRoute bool)
		walk = func(v any, perRoute bool) {
			switch v := v.(type) {
			case map[string]any:
				if h := dig(v, "append", "header"); perRoute && h != nil && h["key"] == key {
					h["value"] = value
					n++
				}
				for k, c := range v {
					walk(c, perRoute || k == "typed_per_filter_config")
				}
			case []any:
				for _, c := range v {
					walk(c, perRoute)
				}
			}
		}
		walk(doc, false)
		if n == 0 {
			return fmt.Errorf("no route sets header %s", key)
		}
		return nil
	}
}

// ClusterTLS is the Edit that gives the cluster named name the TLS of the
// chart's epp.extprocTLS: an UpstreamTlsContext that verifies its hosts'
// certificate against the CA in caFile and by the DNS name sni (SNI and
// a subject-alt-name match, ALPN h2). A health check travels over the
// cluster's TLS, so each host is health-checked on its own (TLS) port.
func ClusterTLS(name, caFile, sni string) func(doc map[string]any) error {
	return func(doc map[string]any) error {
		clusters, _ := dig(doc, "static_resources")["clusters"].([]any)
		for _, c := range clusters {
			if dig(c)["name"] != name {
				continue
			}
			dig(c)["transport_socket"] = map[string]any{
				"name": "envoy.transport_sockets.tls",
				"typed_config": map[string]any{
					"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
					"sni":   sni,
					"common_tls_context": map[string]any{
						"alpn_protocols": []any{"h2"},
						"validation_context": map[string]any{
							"trusted_ca": map[string]any{"filename": caFile},
							"match_typed_subject_alt_names": []any{
								map[string]any{"san_type": "DNS", "matcher": map[string]any{"exact": sni}},
							},
						},
					},
				},
			}
			for _, ep := range endpoints(c) {
				if hc := dig(ep, "health_check_config"); hc != nil {
					hc["port_value"] = dig(ep, "address", "socket_address")["port_value"]
				}
			}
			return nil
		}
		return fmt.Errorf("no cluster %s", name)
	}
}
