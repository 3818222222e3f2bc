package extproc

import (
	"bytes"
)

// usage is the token accounting parsed from a response.
type usage struct {
	prompt, cached, completion int
	seen                       bool
}

// respInfo locates what the response phase rewrites or reads in one JSON
// object: an SSE event's data or a whole non-streaming response. For the
// Responses API, model and usage sit inside "response".
type respInfo struct {
	model        span
	usage        span
	emptyChoices bool
}

func scanResponse(b []byte) (respInfo, error) {
	var ri respInfo
	it, err := newObjIter(b, 0, 1)
	if err != nil {
		return ri, err
	}
	for {
		key, vs, ve, ok, err := it.next()
		if err != nil {
			return ri, err
		}
		if !ok {
			break
		}
		switch {
		case keyIs(key, "model"):
			ri.model = span{vs, ve}
		case keyIs(key, "usage"):
			ri.usage = span{vs, ve}
		case keyIs(key, "choices"):
			ri.emptyChoices = b[vs] == '[' && skipWS(b, vs+1) == ve-1
		case keyIs(key, "response") && b[vs] == '{':
			inner, _ := newObjIter(b, vs, 2)
			for {
				key, vs, ve, ok, _ := inner.next()
				if !ok {
					break
				}
				switch {
				case keyIs(key, "model"):
					ri.model = span{vs, ve}
				case keyIs(key, "usage"):
					ri.usage = span{vs, ve}
				}
			}
		}
	}
	return ri, nil
}

// parseUsage reads an OpenAI usage object (chat and completions names, and
// the Responses API's input/output names).
func parseUsage(b []byte) usage {
	u := usage{}
	it, err := newObjIter(b, 0, 1)
	if err != nil {
		return u
	}
	for {
		key, vs, ve, ok, err := it.next()
		if err != nil || !ok {
			return u
		}
		v := b[vs:ve]
		switch {
		case keyIs(key, "prompt_tokens"), keyIs(key, "input_tokens"):
			u.prompt, u.seen = parseInt(v), true
		case keyIs(key, "completion_tokens"), keyIs(key, "output_tokens"):
			u.completion, u.seen = parseInt(v), true
		case keyIs(key, "prompt_tokens_details"), keyIs(key, "input_tokens_details"):
			if v[0] != '{' {
				continue
			}
			d, _ := newObjIter(v, 0, 2)
			for {
				key, vs, ve, ok, _ := d.next()
				if !ok {
					break
				}
				if keyIs(key, "cached_tokens") {
					u.cached = parseInt(v[vs:ve])
				}
			}
		}
	}
}

// nextEventEnd returns the index after the blank line ending the SSE event
// that starts at or after from, or -1 when the event is incomplete.
func nextEventEnd(b []byte, from int) int {
	for i := from; i < len(b); {
		n := bytes.IndexByte(b[i:], '\n')
		if n < 0 {
			return -1
		}
		j := i + n + 1
		switch {
		case j < len(b) && b[j] == '\n':
			return j + 1
		case j+1 < len(b) && b[j] == '\r' && b[j+1] == '\n':
			return j + 2
		}
		i = j
	}
	return -1
}

// respState is the response phase of one request.
type respState struct {
	sse      bool   // text/event-stream: events forwarded as they complete
	buffer   bool   // JSON: held to end of stream, then rewritten
	rewrite  string // the client-facing model as a JSON literal, "" = no rewrite
	strip    bool   // drop the usage-only event the EPP asked for
	pending  []byte // an incomplete SSE event, or the buffered JSON body
	usage    usage
	edits    []edit
	complete bool
}

// sseChunk returns what can be forwarded now: every complete event of
// pending+data, rewritten; an incomplete tail is held back (at end of
// stream it is flushed as is).
func (r *respState) sseChunk(data []byte, eos bool) []byte {
	if len(r.pending) > 0 {
		data = append(r.pending, data...)
		r.pending = nil
	}
	end := 0
	for {
		e := nextEventEnd(data, end)
		if e < 0 {
			break
		}
		end = e
	}
	if eos {
		end = len(data)
	}
	if end < len(data) {
		rest := data[end:]
		r.pending = rest[:len(rest):len(rest)]
	}
	return r.sseEvents(data[:end])
}

// sseEvents rewrites complete events; it returns b itself when nothing
// changes.
func (r *respState) sseEvents(b []byte) []byte {
	r.edits = r.edits[:0]
	for pos := 0; pos < len(b); {
		evEnd := nextEventEnd(b, pos)
		if evEnd < 0 {
			evEnd = len(b)
		}
		drop := false
		for ls := pos; ls < evEnd; {
			le := ls + bytes.IndexByte(b[ls:evEnd], '\n')
			if le < ls {
				le = evEnd
			}
			line := b[ls:le]
			off := ls
			ls = le + 1
			if !bytes.HasPrefix(line, []byte("data:")) {
				continue
			}
			p := 5
			if p < len(line) && line[p] == ' ' {
				p++
			}
			payload := bytes.TrimRight(line[p:], "\r")
			if len(payload) == 0 || payload[0] != '{' {
				continue
			}
			if r.rewrite == "" && !bytes.Contains(payload, []byte(`"usage"`)) {
				continue
			}
			ri, err := scanResponse(payload)
			if err != nil {
				continue
			}
			if ri.usage.present(payload) {
				r.usage = parseUsage(ri.usage.of(payload))
				if r.strip && ri.emptyChoices {
					drop = true
				}
			}
			if r.rewrite != "" && ri.model.ok() {
				base := off + p
				r.edits = append(r.edits, edit{base + ri.model.s, base + ri.model.e, r.rewrite})
			}
		}
		if drop {
			// The event's own edits go with it.
			for len(r.edits) > 0 && r.edits[len(r.edits)-1].s >= pos {
				r.edits = r.edits[:len(r.edits)-1]
			}
			r.edits = append(r.edits, edit{pos, evEnd, ""})
		}
		pos = evEnd
	}
	if len(r.edits) == 0 {
		return b
	}
	return applyEdits(nil, b, r.edits)
}

// jsonBody handles the buffered JSON response at end of stream: it reads
// usage and rewrites the model; unparseable bodies pass unchanged.
func (r *respState) jsonBody(b []byte) []byte {
	ri, err := scanResponse(b)
	if err != nil {
		return b
	}
	if ri.usage.present(b) {
		r.usage = parseUsage(ri.usage.of(b))
	}
	if r.rewrite != "" && ri.model.ok() {
		return applyEdits(nil, b, []edit{{ri.model.s, ri.model.e, r.rewrite}})
	}
	return b
}
