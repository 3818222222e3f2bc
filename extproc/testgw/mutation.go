package testgw

import (
	"net/http"
	"strings"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http/httpguts"
)

// rejectedMutations counts header mutations the gateway ignored, as
// Envoy's ext_proc filter counts rejected_header_mutations.
var rejectedMutations atomic.Int64

// RejectedMutations is how many header mutations from an EPP the gateways
// of this process have ignored.
func RejectedMutations() int64 { return rejectedMutations.Load() }

// applyMutation applies an EPP's header mutation as Envoy does under its
// default HeaderMutationRules: host, :authority, :scheme, :method and
// x-envoy-* headers are not changed, no pseudo-header or host is removed,
// and a disallowed or invalid mutation is ignored (and counted), never an
// error that fails the request. A processor that echoes the request's own
// headers back (pseudo-headers included) therefore changes nothing. Other
// pseudo-headers (:path) would reroute the request in Envoy; the gateway
// forwards to the path it received, which is what an echo asks for.
func applyMutation(h http.Header, m *extprocv3.HeaderMutation) {
	for _, o := range m.GetSetHeaders() {
		k := o.GetHeader().GetKey()
		v := string(o.GetHeader().GetRawValue())
		if v == "" {
			v = o.GetHeader().GetValue()
		}
		if !mayChange(k) || !httpguts.ValidHeaderFieldValue(v) {
			rejectedMutations.Add(1)
			continue
		}
		if strings.HasPrefix(k, ":") {
			continue
		}
		if o.GetAppendAction() == corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD {
			h.Add(k, v)
		} else {
			h.Set(k, v)
		}
	}
	for _, k := range m.GetRemoveHeaders() {
		if !mayChange(k) || strings.HasPrefix(k, ":") {
			rejectedMutations.Add(1)
			continue
		}
		h.Del(k)
	}
}

// mayChange reports whether Envoy's default rules let a processor set or
// remove header k.
func mayChange(k string) bool {
	k = strings.ToLower(k)
	switch {
	case k == "host" || k == ":authority" || k == ":scheme" || k == ":method":
		return false
	case strings.HasPrefix(k, "x-envoy"):
		return false
	case strings.HasPrefix(k, ":"):
		return len(k) > 1 && httpguts.ValidHeaderFieldName(k[1:])
	default:
		return httpguts.ValidHeaderFieldName(k)
	}
}
