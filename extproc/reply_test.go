package extproc

import (
	"strings"
	"testing"

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
