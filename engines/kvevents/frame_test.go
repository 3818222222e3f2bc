package kvevents

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReplayFrames(t *testing.T) {
	ff := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	seq7 := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	tests := []struct {
		name     string
		layout   ReplayLayout
		reply    [][]byte
		end      [][]byte
		topicOut []byte
	}{
		{"older vLLM and SGLang", ReplayLayoutSeq, [][]byte{{}, seq7, []byte("p")}, [][]byte{{}, ff, {}}, nil},
		{"vLLM 0.26+", ReplayLayoutTopicSeq, [][]byte{{}, []byte("kv"), seq7, []byte("p")}, [][]byte{{}, {}, ff, {}}, []byte("kv")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.reply, ReplayReplyFrames(tt.layout, []byte("kv"), 7, []byte("p")))
			require.Equal(t, tt.end, ReplayEndFrames(tt.layout))

			rep, err := ParseReplayReply(tt.reply)
			require.NoError(t, err)
			require.Equal(t, ReplayReply{Topic: tt.topicOut, Seq: 7, Payload: []byte("p")}, rep)

			end, err := ParseReplayReply(tt.end)
			require.NoError(t, err)
			require.True(t, end.End)
		})
	}
}

func TestReplayRequest(t *testing.T) {
	req := ReplayRequestFrames(0x0102030405060708)
	require.Equal(t, [][]byte{{}, {1, 2, 3, 4, 5, 6, 7, 8}}, req)
	id, start, err := ParseReplayRequest(append([][]byte{[]byte("id")}, req...))
	require.NoError(t, err)
	require.Equal(t, []byte("id"), id)
	require.Equal(t, uint64(0x0102030405060708), start)
}

func TestFrameErrors(t *testing.T) {
	tests := []struct {
		name string
		err  func() error
		msg  string
	}{
		{"message with 2 frames", func() error { _, _, _, err := ParseMessage([][]byte{{}, {}}); return err }, "2 frames"},
		{"message with short seq", func() error { _, _, _, err := ParseMessage([][]byte{{}, {1}, {}}); return err }, "1 bytes"},
		{"reply with 5 frames", func() error { _, err := ParseReplayReply(make([][]byte, 5)); return err }, "5 frames"},
		{"reply without delimiter", func() error { _, err := ParseReplayReply([][]byte{{1}, SeqFrame(1), {}}); return err }, "delimiter"},
		{"reply with bad seq", func() error { _, err := ParseReplayReply([][]byte{{}, {1, 2}, {}}); return err }, "2 bytes"},
		{"request without delimiter", func() error { _, _, err := ParseReplayRequest([][]byte{{1}, {1}, SeqFrame(1)}); return err }, "want [identity"},
		{"request with bad seq", func() error { _, _, err := ParseReplayRequest([][]byte{{1}, {}, {1}}); return err }, "1 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.ErrorContains(t, tt.err(), tt.msg)
		})
	}
}
