package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// output is what the simulated model will say: the text in pieces, each
// piece's token ids, and how many tokens end at each piece, so a streamed
// response can emit exactly the text of the tokens generated so far.
type output struct {
	pieces []string
	ids    []uint32
	// ends[i] is the number of tokens up to and including pieces[i].
	ends []int
	// toolCall is set when the output is a tool call in the model's native
	// (Hermes) format; pieces then spell toolCallPrefix+args+toolCallSuffix.
	toolCall *openai.ToolCall
}

// The Hermes / Qwen tool-call format: what vLLM's hermes parser reads back.
const (
	toolCallPrefixFmt = "<tool_call>\n{\"name\": %q, \"arguments\": "
	toolCallSuffix    = "}\n</tool_call>"
)

// vocabulary holds short words that the tokenizer encodes as one token with
// and without a leading space, so a text output of n tokens is n words.
type vocabulary struct {
	words []string
}

var baseWords = strings.Fields(`the of and to in is was for on that with as by at from it an be this which
or are have has not but had its they were can more one all their been also new
first two time would other into after some only most when may over such any
them out many what about years then made these well both three where there how
than we use used each so under while between could like very through before same
data model cache block token queue load route node fast safe short long prefix
serve reply model train value state event batch score index round check plan`)

func newVocabulary(tok tokenizer.Tokenizer) (*vocabulary, error) {
	v := &vocabulary{}
	var buf []uint32
	for _, w := range baseWords {
		if len(tok.Encode(buf[:0], w)) == 1 && len(tok.Encode(buf[:0], " "+w)) == 1 {
			v.words = append(v.words, w)
		}
	}
	if len(v.words) < 16 {
		return nil, fmt.Errorf("tokenizer %s encodes too few simple words as one token (%d)", tok.Name(), len(v.words))
	}
	return v, nil
}

// textOutput returns n tokens of deterministic prose chosen by seed.
func (v *vocabulary) textOutput(tok tokenizer.Tokenizer, seed uint64, n int) *output {
	o := &output{}
	r := splitmix(seed)
	for i := 0; i < n; i++ {
		w := v.words[r.next()%uint64(len(v.words))]
		if i > 0 {
			w = " " + w
		}
		o.add(tok, w)
	}
	return o
}

// toolCallOutput returns the model's tool call for fn, with arguments built
// from the function's JSON schema, in the order the schema lists them.
func toolCallOutput(tok tokenizer.Tokenizer, v *vocabulary, id string, fn *openai.ToolFunction, seed uint64) (*output, error) {
	args, err := argumentsFromSchema(fn.Parameters, v, splitmix(seed))
	if err != nil {
		return nil, fmt.Errorf("tool %q: %w", fn.Name, err)
	}
	o := &output{toolCall: &openai.ToolCall{ID: id, Type: "function",
		Function: openai.ToolCallFunction{Name: fn.Name, Arguments: args}}}
	text := fmt.Sprintf(toolCallPrefixFmt, fn.Name) + args + toolCallSuffix
	// A model samples a tool call a few characters at a time; split the text
	// into short pieces so streaming shows argument fragments as vLLM does.
	for len(text) > 0 {
		n := 0
		for i := 0; i < 4 && n < len(text); i++ {
			_, size := utf8.DecodeRuneInString(text[n:])
			n += size
		}
		o.add(tok, text[:n])
		text = text[n:]
	}
	return o, nil
}

func (o *output) add(tok tokenizer.Tokenizer, piece string) {
	o.ids = tok.Encode(o.ids, piece)
	o.pieces = append(o.pieces, piece)
	o.ends = append(o.ends, len(o.ids))
}

// tokens returns the number of output tokens.
func (o *output) tokens() int { return len(o.ids) }

// textUpTo returns the concatenated text of the pieces whose tokens are all
// among the first n generated, starting at piece from; it returns the index
// of the first piece not yet emitted.
func (o *output) textUpTo(from, n int) (string, int) {
	i := from
	for i < len(o.pieces) && o.ends[i] <= n {
		i++
	}
	return strings.Join(o.pieces[from:i], ""), i
}

// argumentsFromSchema builds a JSON object that satisfies a simple JSON
// schema: required properties (all properties when none are required) with
// a value of the declared type, enum values taken from the enum.
func argumentsFromSchema(schema json.RawMessage, v *vocabulary, r *rng) (string, error) {
	var b bytes.Buffer
	if len(bytes.TrimSpace(schema)) == 0 {
		return "{}", nil
	}
	if err := writeValue(&b, schema, v, r, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

const maxSchemaDepth = 8

func writeValue(b *bytes.Buffer, schema json.RawMessage, v *vocabulary, r *rng, depth int) error {
	if depth > maxSchemaDepth {
		return fmt.Errorf("schema nested deeper than %d levels", maxSchemaDepth)
	}
	var s struct {
		Type       json.RawMessage   `json:"type"`
		Enum       []json.RawMessage `json:"enum"`
		Properties json.RawMessage   `json:"properties"`
		Required   []string          `json:"required"`
		Items      json.RawMessage   `json:"items"`
	}
	if err := json.Unmarshal(schema, &s); err != nil {
		return fmt.Errorf("cannot decode schema: %w", err)
	}
	if len(s.Enum) > 0 {
		b.Write(s.Enum[r.next()%uint64(len(s.Enum))])
		return nil
	}
	typ := schemaType(s.Type)
	switch typ {
	case "object", "":
		props, err := orderedProperties(s.Properties)
		if err != nil {
			return err
		}
		b.WriteByte('{')
		n := 0
		for _, p := range props {
			if len(s.Required) > 0 && !contains(s.Required, p.name) {
				continue
			}
			if n > 0 {
				b.WriteString(", ")
			}
			n++
			name, _ := json.Marshal(p.name)
			b.Write(name)
			b.WriteString(": ")
			if err := writeValue(b, p.schema, v, r, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case "string":
		b.WriteByte('"')
		b.WriteString(v.words[r.next()%uint64(len(v.words))])
		b.WriteByte('"')
	case "integer":
		b.WriteString(strconv.FormatUint(1+r.next()%100, 10))
	case "number":
		b.WriteString(strconv.FormatUint(1+r.next()%100, 10))
		b.WriteString(".5")
	case "boolean":
		b.WriteString(strconv.FormatBool(r.next()%2 == 0))
	case "array":
		b.WriteByte('[')
		if len(s.Items) > 0 {
			if err := writeValue(b, s.Items, v, r, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case "null":
		b.WriteString("null")
	default:
		return fmt.Errorf("unsupported schema type %q", typ)
	}
	return nil
}

// schemaType returns the first type of "type", which may be a string or a list.
func schemaType(raw json.RawMessage) string {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		for _, t := range many {
			if t != "null" {
				return t
			}
		}
	}
	return ""
}

type property struct {
	name   string
	schema json.RawMessage
}

// orderedProperties decodes a "properties" object keeping its key order,
// which a Go map would lose.
func orderedProperties(raw json.RawMessage) ([]property, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("schema properties must be an object")
	}
	var props []property
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("cannot decode schema properties: %w", err)
		}
		name, _ := t.(string)
		var sub json.RawMessage
		if err := dec.Decode(&sub); err != nil {
			return nil, fmt.Errorf("cannot decode property %q: %w", name, err)
		}
		props = append(props, property{name, sub})
	}
	return props, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// rng is splitmix64: tiny, fast and fully determined by its seed.
type rng struct{ s uint64 }

func splitmix(seed uint64) *rng { return &rng{s: seed} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// seedFor mixes the server seed with the request's own content, so the same
// request on the same seed always gets the same answer.
func seedFor(serverSeed int64, reqSeed *int64, prompt []uint32) uint64 {
	h := xxhash.New()
	var b [8]byte
	put := func(v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		_, _ = h.Write(b[:])
	}
	put(uint64(serverSeed))
	if reqSeed != nil {
		put(uint64(*reqSeed))
	}
	// The prompt's length and tail identify it well enough and keep this
	// cheap on 100k-token prompts.
	put(uint64(len(prompt)))
	tail := prompt[max(0, len(prompt)-256):]
	for _, t := range tail {
		put(uint64(t))
	}
	return h.Sum64()
}

// truncate cuts the output to its first n tokens (whole pieces only, so a
// multi-token piece at the cut is dropped with its tokens).
func (o *output) truncate(n int) {
	i := 0
	for i < len(o.ends) && o.ends[i] <= n {
		i++
	}
	o.pieces, o.ends = o.pieces[:i], o.ends[:i]
	if i == 0 {
		o.ids = o.ids[:0]
	} else {
		o.ids = o.ids[:o.ends[i-1]]
	}
}
