package testgw

import (
	"bytes"
	"net"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/omnious/provider-node/extproc"
)

// TestFloorChunks: the floor sends both bodies back as the EPP does, in
// chunks of at most the EPP's chunk_size (62000 bytes) with the end of
// stream on the last, and their bytes unchanged.
func TestFloorChunks(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(extproc.Config{}.WithDefaults().ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(g, &Floor{Dests: []string{"127.0.0.1:1"}})
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	require.NoError(t, err)
	defer conn.Close()

	for _, n := range []int{0, 1000, 62000, 62001, 200 << 10} {
		st, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
		require.NoError(t, err)
		body := bytes.Repeat([]byte("floor "), n/6+1)[:n]
		require.NoError(t, st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
			RequestHeaders: &extprocv3.HttpHeaders{}}}))
		require.NoError(t, st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}))
		routed, err := st.Recv()
		require.NoError(t, err)
		require.NotNil(t, routed.GetRequestHeaders(), "the routing reply first")
		var got []byte
		for chunks := 0; ; chunks++ {
			r, err := st.Recv()
			require.NoError(t, err)
			sb := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			require.NotNil(t, sb, "%d bytes: a streamed request body chunk", n)
			require.LessOrEqual(t, len(sb.GetBody()), 62000, "%d bytes", n)
			require.True(t, len(sb.GetBody()) > 0 || n == 0, "%d bytes: no empty chunk", n)
			got = append(got, sb.GetBody()...)
			if sb.GetEndOfStream() {
				require.Equal(t, max(1, (n+61999)/62000), chunks+1, "%d bytes: the fewest chunks", n)
				break
			}
		}
		require.Equal(t, string(body), string(got))

		require.NoError(t, st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}))
		got = got[:0]
		for {
			r, err := st.Recv()
			require.NoError(t, err)
			sb := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			require.NotNil(t, sb, "%d bytes: a streamed response body chunk", n)
			require.LessOrEqual(t, len(sb.GetBody()), 62000, "%d bytes", n)
			got = append(got, sb.GetBody()...)
			if sb.GetEndOfStream() {
				break
			}
		}
		require.Equal(t, string(body), string(got))
		require.NoError(t, st.CloseSend())
	}
}
