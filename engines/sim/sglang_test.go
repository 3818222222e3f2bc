package sim

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/kvevents"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/internal/testutil/hexframes"
)

// sglangCapture is what SGLang 0.5.23's own ZmqEventPublisher sent
// (e2e/vllm/sglang_capture.py): one message a line, its frames in hex.
const sglangCapture = "../kvevents/testdata/sglang-0.5.23.frames"

// sglangCaptureEvents are the batches sglang_capture.py publishes, as the
// simulator's engine would emit them.
func sglangCaptureEvents() [][]kvevents.Event {
	neg202 := int64(-202)
	return [][]kvevents.Event{
		{
			{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{101, uint64(neg202)},
				TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: engine.MediumGPU},
			{Kind: kvevents.KindBlockStored, BlockHashes: []uint64{303}, ParentHash: uint64(neg202), HasParent: true,
				TokenIDs: []uint32{9, 10, 11, 12}, BlockSize: 4, CacheSalt: "salt-a", SessionID: "s1"},
		},
		{{Kind: kvevents.KindBlockRemoved, BlockHashes: []uint64{303}, Medium: engine.MediumGPU}},
		{{Kind: kvevents.KindAllBlocksCleared}},
	}
}

// TestSGLangShape publishes the capture's batches through a publisher
// configured as the sglang flavour's defaults configure it, replays them
// over ZMQ, and requires every frame to match SGLang 0.5.23's: topic,
// sequence numbering from 0, and payloads equal field by field (names,
// msgpack types, order) and byte for byte.
func TestSGLangShape(t *testing.T) {
	want := readCapture(t)
	cfg := Config{Engine: engine.Config{Flavour: engine.FlavourSGLang}, KVEvents: KVEventsConfig{
		Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv"}}.WithDefaults()
	require.NoError(t, cfg.Validate())
	pc, err := publisherConfig(cfg, 0)
	require.NoError(t, err)
	pc.Now = func() time.Time { return time.Unix(1765000000, 5e8) } // the capture's ts
	pub, err := kvevents.NewPublisher(pc, zap.NewNop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	for _, evs := range sglangCaptureEvents() {
		_, err := pub.Publish(evs)
		require.NoError(t, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	_, replay := pub.Endpoint(), pub.ReplayEndpoint()
	require.NoError(t, dealer.Dial(replay))
	require.NoError(t, dealer.SendMulti(zmq4.NewMsgFrom(kvevents.ReplayRequestFrames(0)...)))
	for i, w := range want {
		msg, err := dealer.Recv()
		require.NoError(t, err)
		// SGLang 0.5.23 replays (empty, topic, seq, payload): the live
		// message behind the delimiter.
		require.Len(t, msg.Frames, 4, "reply %d", i)
		require.Empty(t, msg.Frames[0])
		got := msg.Frames[1:]
		require.Equal(t, string(w[0]), string(got[0]), "topic of message %d", i)
		require.Equal(t, hex.EncodeToString(w[1]), hex.EncodeToString(got[1]), "sequence of message %d", i)
		require.Equal(t, shape(t, w[2]), shape(t, got[2]), "payload of message %d", i)
		require.Equal(t, hex.EncodeToString(w[2]), hex.EncodeToString(got[2]), "payload bytes of message %d", i)
	}
	end, err := dealer.Recv()
	require.NoError(t, err)
	require.Equal(t, kvevents.ReplayEndFrames(kvevents.ReplayLayoutTopicSeq), end.Frames)
}

// TestShapeSeesDrift: the shape comparison fails on each kind of drift
// TestSGLangShape guards against.
func TestShapeSeesDrift(t *testing.T) {
	base := sglangCaptureEvents()[0]
	enc := func(f kvevents.Format, h kvevents.HashEncoding, evs []kvevents.Event) []string {
		b, err := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1765000000.5, Events: evs, HasDPRank: true}, f, h)
		require.NoError(t, err)
		return shape(t, b)
	}
	want := shape(t, readCapture(t)[0][2])
	require.Equal(t, want, enc(kvevents.FormatMapSGLang, kvevents.HashInt64, base))
	noSession := append([]kvevents.Event(nil), base...)
	noSession[1].SessionID = ""
	for name, got := range map[string][]string{
		"positional arrays": enc(kvevents.FormatArraySGLang, kvevents.HashInt64, base),
		"vLLM maps":         enc(kvevents.FormatMap, kvevents.HashInt64, base),
		"unsigned hashes":   enc(kvevents.FormatMapSGLang, kvevents.HashUint64, base),
		"missing field":     enc(kvevents.FormatMapSGLang, kvevents.HashInt64, noSession),
	} {
		require.NotEqual(t, want, got, name)
	}
}

func readCapture(t *testing.T) [][][]byte {
	t.Helper()
	msgs := hexframes.Read(t, sglangCapture)
	for _, frames := range msgs {
		require.Len(t, frames, 3, "capture message %x", frames)
	}
	require.Len(t, msgs, len(sglangCaptureEvents()))
	return msgs
}

// shape lists a msgpack value one node a line in wire order: its path (map
// keys by name, array items by index), its msgpack family (uint and int
// apart, as the wire tells them apart) and, for containers, its length.
func shape(t *testing.T, b []byte) []string {
	t.Helper()
	d := msgpack.NewDecoder(bytes.NewReader(b))
	var out []string
	require.NoError(t, walk(d, "$", &out))
	_, err := d.PeekCode()
	require.Error(t, err, "trailing bytes after the value")
	return out
}

func walk(d *msgpack.Decoder, path string, out *[]string) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return err
		}
		*out = append(*out, fmt.Sprintf("%s map[%d]", path, n))
		for i := 0; i < n; i++ {
			k, err := d.DecodeString()
			if err != nil {
				return fmt.Errorf("%s key %d: %w", path, i, err)
			}
			if err := walk(d, path+"."+k, out); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		*out = append(*out, fmt.Sprintf("%s array[%d]", path, n))
		for i := 0; i < n; i++ {
			if err := walk(d, fmt.Sprintf("%s[%d]", path, i), out); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := d.DecodeInterface(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	*out = append(*out, path+" "+family(c))
	return nil
}

func family(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	case msgpcode.IsFixedNum(c) && int8(c) >= 0, c >= msgpcode.Uint8 && c <= msgpcode.Uint64:
		return "uint"
	case msgpcode.IsFixedNum(c), c >= msgpcode.Int8 && c <= msgpcode.Int64:
		return "int"
	case c == msgpcode.Float:
		return "float32"
	case c == msgpcode.Double:
		return "float64"
	case msgpcode.IsString(c):
		return "str"
	case msgpcode.IsBin(c):
		return "bin"
	}
	return fmt.Sprintf("code %#x", c)
}
