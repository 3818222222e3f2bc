package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"
)

// Event is one data line of a streamed answer: a chunk as JSON, or the
// [DONE] that ends the stream.
type Event struct {
	// At is when the read that delivered the line's last byte returned:
	// the chunk's arrival, taken before anything decodes it. Lines that
	// arrive in one read share it.
	At time.Time
	// Data is the line's value after "data:", white space trimmed. It
	// aliases the reader's buffer: valid until the loop goes on.
	Data []byte
	// Done is data: [DONE].
	Done bool
}

// ErrLineTooLong ends a stream with a line longer than Events' bound.
var ErrLineTooLong = errors.New("stream line too long")

// DefaultMaxLine is the line bound Events takes when given none.
const DefaultMaxLine = 64 << 10

// Events reads a server-sent-event body as OpenAI-compatible servers
// stream it: each "data:" line is one event, reported as soon as the line
// is complete (the blank line after it is not waited for). Lines end in
// LF or CRLF and may arrive split across reads; comments (":
// keep-alive"), blank lines and the other fields (event:, id:, retry:)
// are skipped.
//
// The iteration ends at the end of the body, not at [DONE]: a caller
// stops at the Done event or reads on. It yields at most one error, last:
// the body's read error, or ErrLineTooLong for a line of more than
// maxLine bytes (its terminator not counted; maxLine < 1 is
// DefaultMaxLine), so the reader never buffers more than maxLine+2 bytes
// whatever the body. A line cut by a read error is not reported, only the
// error; a last line without its terminator at a clean end is. Events
// never decodes: a malformed chunk is the decoder's error (Chunk). Kept
// by TestEvents and FuzzEvents.
func Events(r io.Reader, maxLine int) iter.Seq2[Event, error] {
	if maxLine < 1 {
		maxLine = DefaultMaxLine
	}
	return func(yield func(Event, error) bool) {
		tr := &timedReader{r: r}
		sc := bufio.NewScanner(tr)
		bound := maxLine + len("\r\n")
		sc.Buffer(make([]byte, 0, min(4096, bound)), bound)
		sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
			if atEOF && tr.err != io.EOF && bytes.IndexByte(data, '\n') < 0 {
				return 0, nil, nil // cut by tr.err, which the scanner reports
			}
			return bufio.ScanLines(data, atEOF)
		})
		for sc.Scan() {
			line := sc.Bytes()
			if len(line) > maxLine {
				yield(Event{}, tooLong(maxLine))
				return
			}
			data, ok := bytes.CutPrefix(line, []byte("data:"))
			if !ok {
				continue
			}
			data = bytes.TrimSpace(data)
			if !yield(Event{At: tr.at, Data: data, Done: bytes.Equal(data, []byte("[DONE]"))}, nil) {
				return
			}
		}
		if err := sc.Err(); err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				err = tooLong(maxLine)
			}
			yield(Event{}, err)
		}
	}
}

func tooLong(maxLine int) error {
	return fmt.Errorf("%w: more than %d bytes", ErrLineTooLong, maxLine)
}

// timedReader notes when each read returned data, and the error that
// ended the reading.
type timedReader struct {
	r   io.Reader
	at  time.Time
	err error
}

func (t *timedReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		t.at = time.Now()
	}
	if err != nil {
		t.err = err
	}
	return n, err
}

// StreamError is the error event an engine sends in place of a chunk
// when generation fails mid-stream: data: {"error": {...}}.
type StreamError struct {
	ErrorBody
}

func (e *StreamError) Error() string { return "stream error: " + e.Message }

// Chunk decodes the event's data as a Chunk; an error event is a
// *StreamError. Callers that need fields Chunk does not have decode Data
// into their own shape.
func (e Event) Chunk() (Chunk, error) {
	var c struct {
		Chunk
		Error *ErrorBody `json:"error"`
	}
	if err := json.Unmarshal(e.Data, &c); err != nil {
		return Chunk{}, fmt.Errorf("cannot decode stream chunk: %w", err)
	}
	if c.Error != nil {
		return Chunk{}, &StreamError{*c.Error}
	}
	return c.Chunk, nil
}
