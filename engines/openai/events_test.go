package openai

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"
)

// pieces is a body that returns one piece per read, then err (io.EOF when
// nil).
type pieces struct {
	p   []string
	err error
}

func (r *pieces) Read(b []byte) (int, error) {
	if len(r.p) == 0 {
		if r.err == nil {
			return 0, io.EOF
		}
		return 0, r.err
	}
	n := copy(b, r.p[0])
	if r.p[0] = r.p[0][n:]; r.p[0] == "" {
		r.p = r.p[1:]
	}
	return n, nil
}

// collect runs Events over r: each event's data ("DONE" for [DONE]) and
// the error that ended it.
func collect(r io.Reader, maxLine int) ([]string, error) {
	var got []string
	for ev, err := range Events(r, maxLine) {
		if err != nil {
			return got, err
		}
		if ev.Done {
			got = append(got, "DONE")
			continue
		}
		got = append(got, string(ev.Data))
	}
	return got, nil
}

func TestEvents(t *testing.T) {
	const (
		a    = `{"choices":[{"delta":{"content":"a"}}]}`
		b    = `{"choices":[{"delta":{"content":"b"}}]}`
		use  = `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
		boom = `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`
	)
	cut := errors.New("connection reset")
	for _, tc := range []struct {
		name    string
		body    []string
		readErr error
		maxLine int
		want    []string
		err     error
	}{
		{"vllm", []string{"data: " + a + "\n\ndata: " + b + "\n\ndata: " + use + "\n\ndata: [DONE]\n\n"}, nil, 0,
			[]string{a, b, use, "DONE"}, nil},
		{"split reads", []string{"da", "ta: {\"choices\":[{\"delta\":", "{\"content\":\"a\"}}]}", "\n", "\ndata: [DO", "NE]\n\n"}, nil, 0,
			[]string{a, "DONE"}, nil},
		{"CRLF", []string{"data: " + a + "\r\n\r\ndata: [DONE]\r", "\n\r\n"}, nil, 0, []string{a, "DONE"}, nil},
		{"comments, other fields, no space after the colon", []string{": keep-alive\n\nevent: x\nid: 7\nretry: 10\ndata:" + a + "\n\n: ping\ndata: [DONE]\n\n"}, nil, 0,
			[]string{a, "DONE"}, nil},
		{"read on after [DONE]", []string{"data: [DONE]\n\ndata: " + a + "\n\n"}, nil, 0, []string{"DONE", a}, nil},
		{"no blank lines, no last terminator", []string{"data: " + a + "\ndata: [DONE]"}, nil, 0, []string{a, "DONE"}, nil},
		{"an error event is data", []string{"event: error\ndata: " + boom + "\n\n"}, nil, 0, []string{boom}, nil},
		{"a line of maxLine", []string{"data: " + a + "\r\n"}, nil, len("data: " + a), []string{a}, nil},
		{"an over-long line", []string{"data: " + a + "\n\ndata: " + strings.Repeat("x", 100) + "\n\ndata: [DONE]\n\n"}, nil, 64,
			[]string{a}, ErrLineTooLong},
		{"an over-long line by one", []string{"data: " + a + "\n"}, nil, len("data: "+a) - 1, nil, ErrLineTooLong},
		{"a line that never ends", []string{"data: ", strings.Repeat("x", 1<<20)}, nil, 1000, nil, ErrLineTooLong},
		{"truncated", []string{"data: " + a + "\n\ndata: {\"choi"}, cut, 0, []string{a}, cut},
		{"truncated between lines", []string{"data: " + a + "\n\n"}, cut, 0, []string{a}, cut},
		{"empty", nil, nil, 0, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := collect(&pieces{p: append([]string(nil), tc.body...), err: tc.readErr}, tc.maxLine)
			require.Equal(t, tc.want, got)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
		})
	}
}

// TestEventsOneByte reads a stream a byte at a time: the worst split.
func TestEventsOneByte(t *testing.T) {
	body := "data: {\"a\":1}\r\n\r\n: ka\n\ndata: [DONE]\n\n"
	got, err := collect(iotest.OneByteReader(strings.NewReader(body)), 0)
	require.NoError(t, err)
	require.Equal(t, []string{`{"a":1}`, "DONE"}, got)
	_, err = collect(iotest.TimeoutReader(strings.NewReader(body)), 0)
	require.ErrorIs(t, err, iotest.ErrTimeout)
}

// TestEventsAt: an event's time is that of the read that completed its
// line, whatever the caller did before asking for it.
func TestEventsAt(t *testing.T) {
	r := &pieces{p: []string{"data: 1\n\ndata: 2\n\ndata: ", "3\n\n"}}
	var at []time.Time
	before := time.Now()
	for ev, err := range Events(r, 0) {
		require.NoError(t, err)
		at = append(at, ev.At)
		time.Sleep(2 * time.Millisecond) // a slow decoder
	}
	require.Len(t, at, 3)
	require.False(t, at[0].Before(before))
	require.Equal(t, at[0], at[1], "lines of one read arrive together")
	require.True(t, at[2].Sub(at[1]) >= 2*time.Millisecond, "the third line's end came in a later read")
}

// TestEventsStop: breaking out of the loop stops the reading.
func TestEventsStop(t *testing.T) {
	r := &pieces{p: []string{"data: 1\n\n", "data: 2\n\n"}}
	for ev, err := range Events(r, 0) {
		require.NoError(t, err)
		require.Equal(t, "1", string(ev.Data))
		break
	}
	require.Equal(t, []string{"data: 2\n\n"}, r.p, "the second line was never read")
}

func TestChunk(t *testing.T) {
	text := func(s string) *string { return &s }
	for _, tc := range []struct {
		name, data string
		want       Chunk
		err        string
	}{
		{"content", `{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
			Chunk{ID: "c", Object: "chat.completion.chunk", Model: "m", Choices: []ChunkChoice{{Delta: &Delta{Content: text("hi")}}}}, ""},
		{"usage only", `{"id":"c","object":"text_completion","model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}`,
			Chunk{ID: "c", Object: "text_completion", Model: "m", Choices: []ChunkChoice{},
				Usage: &Usage{PromptTokens: 3, TotalTokens: 5, CompletionTokens: 2, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 1}}}, ""},
		{"error event", `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`, Chunk{}, "stream error: boom"},
		{"not JSON", `{"choices":`, Chunk{}, "cannot decode stream chunk"},
		{"[DONE]", `[DONE]`, Chunk{}, "cannot decode stream chunk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Event{Data: []byte(tc.data)}.Chunk()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, c)
		})
	}
	_, err := Event{Data: []byte(`{"error":{"message":"boom","code":500}}`)}.Chunk()
	var se *StreamError
	require.ErrorAs(t, err, &se)
	require.Equal(t, 500, se.Code)
}
