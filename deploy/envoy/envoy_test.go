package envoy

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	headertometadatav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/omnious/provider-node/extproc"
)

type validator interface{ ValidateAll() error }

func loadBootstrap(t *testing.T) *bootstrapv3.Bootstrap { return loadBootstrapFile(t, "envoy.yaml") }

func loadBootstrapFile(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	js, err := json.Marshal(doc)
	require.NoError(t, err)
	var b bootstrapv3.Bootstrap
	require.NoError(t, protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(js, &b))
	require.NoError(t, b.ValidateAll())
	return &b
}

func unpack[T proto.Message](t *testing.T, m interface{ UnmarshalTo(proto.Message) error }, into T) T {
	t.Helper()
	require.NoError(t, m.UnmarshalTo(into))
	if v, ok := any(into).(validator); ok {
		require.NoError(t, v.ValidateAll())
	}
	return into
}

func TestBootstrap(t *testing.T) {
	b := loadBootstrap(t)

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.StaticResources.Clusters {
		clusters[c.Name] = c
	}
	pool := clusters["inference_pool"]
	require.NotNil(t, pool)
	require.Equal(t, clusterv3.Cluster_ORIGINAL_DST, pool.GetType())
	require.Equal(t, clusterv3.Cluster_CLUSTER_PROVIDED, pool.LbPolicy)
	require.True(t, pool.GetOriginalDstLbConfig().UseHttpHeader)
	require.Equal(t, extproc.HeaderDestination, pool.GetOriginalDstLbConfig().HttpHeaderName)

	epp := clusters["epp"]
	require.NotNil(t, epp)
	addr := epp.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint()
	require.Equal(t, "127.0.0.1", addr.Address.GetSocketAddress().Address)
	require.Equal(t, uint32(9002), addr.Address.GetSocketAddress().GetPortValue())
	require.Equal(t, "envoy.service.ext_proc.v3.ExternalProcessor", epp.HealthChecks[0].GetGrpcHealthCheck().ServiceName)
	opts := unpack(t, epp.TypedExtensionProtocolOptions["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], &upstreamhttpv3.HttpProtocolOptions{})
	require.NotNil(t, opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions(), "ext_proc needs HTTP/2")

	require.Len(t, b.StaticResources.Listeners, 1)
	f := b.StaticResources.Listeners[0].FilterChains[0].Filters[0]
	hcm := unpack(t, f.GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	route := hcm.GetRouteConfig().VirtualHosts[0].Routes[0].GetRoute()
	require.Equal(t, "inference_pool", route.GetCluster())
	require.Positive(t, route.RetryPolicy.GetNumRetries().GetValue())

	names := make([]string, len(hcm.HttpFilters))
	for i, f := range hcm.HttpFilters {
		names[i] = f.Name
	}
	// The client's gateway-only headers go before anything reads them;
	// the route's band and tenant are set, then copied into metadata, and
	// only then does the EPP see the request.
	require.Equal(t, []string{"omnious.strip_client_headers", "omnious.route_headers", "envoy.filters.http.header_to_metadata",
		"envoy.filters.http.ext_proc", "envoy.filters.http.router"}, names)
	strip := unpack(t, hcm.HttpFilters[0].GetTypedConfig(), &headermutationv3.HeaderMutation{})
	var removed []string
	for _, m := range strip.GetMutations().GetRequestMutations() {
		removed = append(removed, m.GetRemove())
	}
	xc := extproc.Config{}.WithDefaults()
	require.ElementsMatch(t, []string{xc.BandHeader, xc.TenantHeader, xc.SessionHeader, extproc.HeaderCalibration}, removed)
	require.Empty(t, unpack(t, hcm.HttpFilters[1].GetTypedConfig(), &headermutationv3.HeaderMutation{}).GetMutations().GetRequestMutations(),
		"route_headers sets only what a route's typed_per_filter_config says")
	h2m := unpack(t, hcm.HttpFilters[2].GetTypedConfig(), &headertometadatav3.Config{})
	var copied []string
	for _, r := range h2m.GetRequestRules() {
		require.Equal(t, extproc.MetadataGateway, r.GetOnHeaderPresent().GetMetadataNamespace())
		require.Equal(t, r.GetHeader(), r.GetOnHeaderPresent().GetKey())
		copied = append(copied, r.GetHeader())
	}
	require.ElementsMatch(t, []string{xc.BandHeader, xc.TenantHeader}, copied)
	ep := unpack(t, hcm.HttpFilters[3].GetTypedConfig(), &extprocfilterv3.ExternalProcessor{})
	require.Equal(t, "epp", ep.GetGrpcService().GetEnvoyGrpc().ClusterName)
	require.Equal(t, int64(1000), ep.MessageTimeout.GetSeconds())
	require.False(t, ep.FailureModeAllow, "FailClose by default; see README")
	pm := ep.ProcessingMode
	require.Equal(t, extprocfilterv3.ProcessingMode_SEND, pm.RequestHeaderMode)
	require.Equal(t, extprocfilterv3.ProcessingMode_SEND, pm.ResponseHeaderMode)
	require.Equal(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, pm.RequestBodyMode)
	require.Equal(t, extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, pm.ResponseBodyMode)
	require.Equal(t, extprocfilterv3.ProcessingMode_SEND, pm.RequestTrailerMode)
	require.Equal(t, extprocfilterv3.ProcessingMode_SEND, pm.ResponseTrailerMode)
	require.ElementsMatch(t, []string{extproc.MetadataLB, extproc.MetadataSubset, extproc.MetadataGateway}, ep.MetadataOptions.GetForwardingNamespaces().GetUntyped())
	require.Equal(t, []string{extproc.MetadataLB}, ep.MetadataOptions.GetReceivingNamespaces().GetUntyped())
}

// TestTwoEPPs: envoy-two-epps.yaml is envoy.yaml with a second EPP host in
// the ext_proc cluster, each health-checked on its own health port, and
// nothing else different.
func TestTwoEPPs(t *testing.T) {
	one, two := loadBootstrap(t), loadBootstrapFile(t, "envoy-two-epps.yaml")
	eppOf := func(b *bootstrapv3.Bootstrap) *clusterv3.Cluster {
		for _, c := range b.StaticResources.Clusters {
			if c.Name == "epp" {
				return c
			}
		}
		t.Fatal("no epp cluster")
		return nil
	}
	hosts := eppOf(two).GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()
	require.Len(t, hosts, 2)
	for i, want := range [][2]uint32{{9002, 9003}, {9012, 9013}} {
		ep := hosts[i].GetEndpoint()
		require.Equal(t, "127.0.0.1", ep.GetAddress().GetSocketAddress().GetAddress())
		require.Equal(t, want[0], ep.GetAddress().GetSocketAddress().GetPortValue())
		require.Equal(t, want[1], ep.GetHealthCheckConfig().GetPortValue(), "each EPP health-checked on its own port")
	}
	require.NotEmpty(t, eppOf(two).GetHealthChecks())
	// The rest is the same.
	eppOf(two).LoadAssignment = eppOf(one).GetLoadAssignment()
	require.True(t, proto.Equal(one, two), "envoy-two-epps.yaml differs from envoy.yaml beyond the EPP hosts")
}
