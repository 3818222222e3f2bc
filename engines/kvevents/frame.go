package kvevents

import (
	"encoding/binary"
	"fmt"
)

// SeqLen is the size of the big-endian sequence-number frame.
const SeqLen = 8

// EndSeq is the sequence number of the replay end marker (-1 as 8 bytes).
const EndSeq = ^uint64(0)

// ReplayLayout selects the frames of a replay reply as seen by the DEALER
// (the ROUTER's identity frame already stripped).
type ReplayLayout uint8

const (
	// ReplayLayoutSeq is older vLLM and SGLang: [empty, seq, payload], end
	// marker [empty, FF*8, empty].
	ReplayLayoutSeq ReplayLayout = iota
	// ReplayLayoutTopicSeq is vLLM 0.26+: [empty, topic, seq, payload], end
	// marker [empty, empty, FF*8, empty].
	ReplayLayoutTopicSeq
)

// String names the layout for logs and configs.
func (l ReplayLayout) String() string {
	switch l {
	case ReplayLayoutSeq:
		return "seq"
	case ReplayLayoutTopicSeq:
		return "topic-seq"
	}
	return fmt.Sprintf("ReplayLayout(%d)", uint8(l))
}

// SeqFrame returns seq as an 8-byte big-endian frame.
func SeqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, SeqLen), seq)
}

// ParseSeq reads an 8-byte big-endian sequence frame.
func ParseSeq(f []byte) (uint64, error) {
	if len(f) != SeqLen {
		return 0, fmt.Errorf("cannot parse sequence frame: %d bytes, want %d", len(f), SeqLen)
	}
	return binary.BigEndian.Uint64(f), nil
}

// MessageFrames builds the three frames of one published batch.
func MessageFrames(topic []byte, seq uint64, payload []byte) [][]byte {
	return [][]byte{topic, SeqFrame(seq), payload}
}

// ParseMessage splits a published message into topic, sequence and payload.
// The returned slices alias frames.
func ParseMessage(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	if len(frames) != 3 {
		return nil, 0, nil, fmt.Errorf("cannot parse message: %d frames, want 3", len(frames))
	}
	seq, err = ParseSeq(frames[1])
	if err != nil {
		return nil, 0, nil, fmt.Errorf("cannot parse message: %w", err)
	}
	return frames[0], seq, frames[2], nil
}

// ReplayRequestFrames builds the DEALER's request for every buffered batch
// with a sequence number of at least start.
func ReplayRequestFrames(start uint64) [][]byte {
	return [][]byte{{}, SeqFrame(start)}
}

// ParseReplayRequest reads a request as the ROUTER sees it: [identity,
// empty, start_seq]. It returns the identity frame to address replies with.
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 {
		return nil, 0, fmt.Errorf("cannot parse replay request: want [identity, empty, seq], got %d frames", len(frames))
	}
	start, err = ParseSeq(frames[2])
	if err != nil {
		return nil, 0, fmt.Errorf("cannot parse replay request: %w", err)
	}
	return frames[0], start, nil
}

// ReplayReplyFrames builds one replayed batch as the DEALER receives it;
// prefix the identity frame to send it from a ROUTER.
func ReplayReplyFrames(l ReplayLayout, topic []byte, seq uint64, payload []byte) [][]byte {
	if l == ReplayLayoutTopicSeq {
		return [][]byte{{}, topic, SeqFrame(seq), payload}
	}
	return [][]byte{{}, SeqFrame(seq), payload}
}

// ReplayEndFrames builds the end marker as the DEALER receives it.
func ReplayEndFrames(l ReplayLayout) [][]byte {
	if l == ReplayLayoutTopicSeq {
		return [][]byte{{}, {}, SeqFrame(EndSeq), {}}
	}
	return [][]byte{{}, SeqFrame(EndSeq), {}}
}

// ReplayReply is one parsed replay reply.
type ReplayReply struct {
	// Topic is set only in ReplayLayoutTopicSeq.
	Topic   []byte
	Seq     uint64
	Payload []byte
	// End marks the end-of-replay marker; Seq and Payload are then unset.
	End bool
}

// ParseReplayReply reads a reply as the DEALER receives it. The layout is
// told apart by the frame count, so one subscriber serves both engine
// generations.
func ParseReplayReply(frames [][]byte) (ReplayReply, error) {
	var rep ReplayReply
	if len(frames) != 3 && len(frames) != 4 {
		return rep, fmt.Errorf("cannot parse replay reply: %d frames, want 3 or 4", len(frames))
	}
	if len(frames[0]) != 0 {
		return rep, fmt.Errorf("cannot parse replay reply: first frame is not the empty delimiter")
	}
	if len(frames) == 4 {
		rep.Topic = frames[1]
		frames = frames[1:]
	}
	seq, err := ParseSeq(frames[1])
	if err != nil {
		return rep, fmt.Errorf("cannot parse replay reply: %w", err)
	}
	if seq == EndSeq {
		return ReplayReply{End: true}, nil
	}
	rep.Seq, rep.Payload = seq, frames[2]
	return rep, nil
}
