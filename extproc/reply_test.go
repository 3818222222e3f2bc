package extproc

import (
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// TestLBMetadataEncoding checks the directly encoded routing metadata
// against proto's own encoding of lbMetadata, for destinations whose
// lengths take one, two and three varint bytes, and that a reply carrying
// it decodes to DynamicMetadata with nothing left unknown.
func TestLBMetadataEncoding(t *testing.T) {
	for _, dest := range []string{"127.0.0.1:8000", "10.0.0.1:8000,10.0.0.2:8000,[fd00::3]:8000",
		strings.Repeat("a", 200), strings.Repeat("b", 20000)} {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&extprocv3.ProcessingResponse{DynamicMetadata: lbMetadata(dest)})
		require.NoError(t, err)
		require.Equal(t, want, appendLBMetadata(nil, dest), "dest of %d bytes", len(dest))

		pr := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{}}}
		pr.ProtoReflect().SetUnknown(appendLBMetadata([]byte{}, dest))
		b, err := proto.Marshal(pr)
		require.NoError(t, err)
		var got extprocv3.ProcessingResponse
		require.NoError(t, proto.Unmarshal(b, &got))
		require.True(t, proto.Equal(lbMetadata(dest), got.DynamicMetadata))
		require.Empty(t, got.ProtoReflect().GetUnknown())
		require.NotNil(t, got.GetRequestHeaders())
	}
}

// typedRouteReply is the routing reply built from the nested messages, as
// proto marshals it: what routeReply's encoding must equal.
func typedRouteReply(set []header, remove []string, dest string, body *extprocv3.BodyMutation) *extprocv3.ProcessingResponse {
	hm := &extprocv3.HeaderMutation{RemoveHeaders: remove}
	for _, h := range set {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: h.key, RawValue: h.value},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	if len(set) == 0 && len(remove) == 0 {
		hm = nil
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: hm, BodyMutation: body}
	pr := &extprocv3.ProcessingResponse{DynamicMetadata: lbMetadata(dest)}
	if body != nil {
		pr.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	} else {
		pr.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	}
	return pr
}

// TestRouteReplyEncoding checks the directly encoded routing reply against
// the same reply built from messages: on headers byte for byte against
// proto's encoding, and on headers and on a BUFFERED body that it decodes
// to that reply with nothing left unknown; for no headers, the five a reply can carry,
// lengths whose varints take one to three bytes, and removed headers.
func TestRouteReplyEncoding(t *testing.T) {
	long := strings.Repeat("x", 300)
	cases := []struct {
		name   string
		set    []header
		remove []string
		dest   string
	}{
		{"none", nil, nil, "127.0.0.1:8000"},
		{"destination", []header{{HeaderDestination, []byte("127.0.0.1:8000")}}, nil, "127.0.0.1:8000"},
		{"all", []header{{HeaderDestination, []byte("10.0.0.1:8000,10.0.0.2:8000")}, {headerRequestID, []byte("epp-1")},
			{headerTraceparent, []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}, {headerTracestate, []byte("a=b")},
			{headerContentLen, []byte("1024")}}, []string{HeaderModelRewrite, KeyServed}, "10.0.0.1:8000,10.0.0.2:8000"},
		{"long", []header{{HeaderDestination, []byte(long)}, {headerRequestID, []byte(strings.Repeat("i", 20000))}},
			[]string{long}, long},
		{"remove only", nil, []string{KeySubset}, "[fd00::3]:8000"},
		{"empty value", []header{{headerRequestID, nil}}, nil, "127.0.0.1:8000"},
	}
	for _, c := range cases {
		for _, body := range []*extprocv3.BodyMutation{nil, {Mutation: &extprocv3.BodyMutation_Body{Body: []byte(`{"model":"m"}`)}}} {
			t.Run(fmt.Sprintf("%s/body=%t", c.name, body != nil), func(t *testing.T) {
				var r routeReply
				for _, h := range c.set {
					r.add(h.key, h.value)
				}
				var got *extprocv3.ProcessingResponse
				if body != nil {
					got = r.onRequestBody(c.remove, c.dest, body)
				} else {
					got = r.onHeaders(c.remove, c.dest)
				}
				want := typedRouteReply(c.set, c.remove, c.dest, body)
				wantWire, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
				require.NoError(t, err)
				gotWire, err := proto.Marshal(got)
				require.NoError(t, err)
				if body == nil {
					require.Equal(t, wantWire, gotWire)
				}

				var decoded extprocv3.ProcessingResponse
				require.NoError(t, proto.Unmarshal(gotWire, &decoded))
				require.True(t, proto.Equal(want, &decoded), "decoded %v", &decoded)
				require.Empty(t, decoded.ProtoReflect().GetUnknown())
			})
		}
	}
}

// BenchmarkRouteReply is the codec's marshalling of the routing reply of
// BenchmarkExtProcRoundTrip (destination and content length, and the
// envoy.lb metadata), encoded by routeReply and built from messages (the
// metadata Struct included), against floorServer's empty answer.
func BenchmarkRouteReply(b *testing.B) {
	set := []header{{HeaderDestination, []byte("127.0.0.1:8000")}, {headerContentLen, []byte("1024")}}
	var r routeReply
	for _, h := range set {
		r.add(h.key, h.value)
	}
	c := NewCodec(NewBufferPool())
	for _, m := range []struct {
		name string
		msg  *extprocv3.ProcessingResponse
	}{
		{"encoded", r.onHeaders(nil, "127.0.0.1:8000")},
		{"messages", typedRouteReply(set, nil, "127.0.0.1:8000", nil)},
		{"floor", &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}},
	} {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bs, err := c.Marshal(m.msg)
				if err != nil {
					b.Fatal(err)
				}
				bs.Free()
			}
		})
	}
}
