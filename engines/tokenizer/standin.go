package tokenizer

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/omnious/provider-node/engines/openai"
)

// Special token ids of the stand-in vocabulary. They follow Qwen2.5/Qwen3 so
// that prompts look like a real ChatML model's to anything that inspects ids.
const (
	StandInEndOfText  uint32 = 151643
	StandInIMStart    uint32 = 151644
	StandInIMEnd      uint32 = 151645
	StandInToolCall   uint32 = 151657
	StandInToolCallE  uint32 = 151658
	standInVocab             = 151643 // ordinary ids are in [0, standInVocab)
	standInMaxPiece          = 6      // runes per piece: about 4 characters per token on English
	standInMaxDigits         = 3      // digits per piece, as Qwen and Llama 3 split numbers
	standInSpecialLen        = len("<|endoftext|>")
)

var standInSpecials = []struct {
	text string
	id   uint32
}{
	{"<|endoftext|>", StandInEndOfText},
	{"<|im_start|>", StandInIMStart},
	{"<|im_end|>", StandInIMEnd},
	{"<tool_call>", StandInToolCall},
	{"</tool_call>", StandInToolCallE},
}

// StandIn is a deterministic tokenizer used until a model's real tokenizer is
// loaded: the simulator and the EPP agree on its ids, a shared text prefix
// gives a shared id prefix (up to the last piece), and English text yields
// about one token per four characters, like a real BPE vocabulary.
//
// Pieces are: a special token; an optional space followed by up to six
// letters or marks; up to three digits; a run of whitespace; any other single
// character. A piece's id is its xxhash modulo the vocabulary size.
type StandIn struct{}

// NewStandIn returns the stand-in tokenizer.
func NewStandIn() StandIn { return StandIn{} }

// Name implements Tokenizer.
func (StandIn) Name() string { return "standin" }

// Encode implements Tokenizer.
func (t StandIn) Encode(dst []uint32, text string) []uint32 {
	return t.encode(dst, text, false, nil, nil)
}

// encode implements Restarting. The text is cut at mids and each part
// encoded on its own, as if the text ended there: nextCut's cuts are where
// that changes nothing.
func (StandIn) encode(dst []uint32, text string, _ bool, mids []int, cut func(end, n int)) []uint32 {
	at := 0
	for _, m := range mids {
		dst = encodeStandIn(dst, text[at:m], at, cut)
		cut(m, len(dst))
		at = m
	}
	return encodeStandIn(dst, text[at:], at, cut)
}

// encodeStandIn appends the pieces of text, calling cut after each added
// token with its end offset plus off. Every '<' starts a piece (it is
// neither a letter, a digit nor a space), so an added token is matched
// wherever it occurs and the pieces after it do not depend on the text
// before it.
func encodeStandIn(dst []uint32, text string, off int, cut func(end, n int)) []uint32 {
	end := off + len(text)
	for len(text) > 0 {
		if text[0] == '<' {
			if id, n := matchStandInSpecial(text); n > 0 {
				dst = append(dst, id)
				text = text[n:]
				if cut != nil {
					cut(end-len(text), len(dst))
				}
				continue
			}
		}
		n := standInPieceLen(text)
		dst = append(dst, standInPieceID(text[:n]))
		text = text[n:]
	}
	return dst
}

// splitAdded implements Restarting.
func (StandIn) splitAdded(s string, emit func(seg string, id int32)) {
	from := 0
	for i := 0; i < len(s); {
		k := strings.IndexByte(s[i:], '<')
		if k < 0 {
			break
		}
		i += k
		id, n := matchStandInSpecial(s[i:])
		if n == 0 {
			i++
			continue
		}
		if i > from {
			emit(s[from:i], -1)
		}
		emit(s[i:i+n], int32(id))
		i += n
		from = i
	}
	if from < len(s) {
		emit(s[from:], -1)
	}
}

func matchStandInSpecial(s string) (uint32, int) {
	if len(s) > standInSpecialLen {
		s = s[:standInSpecialLen]
	}
	for _, sp := range standInSpecials {
		if strings.HasPrefix(s, sp.text) {
			return sp.id, len(sp.text)
		}
	}
	return 0, 0
}

// standInPieceLen returns the byte length of the piece at the start of s (len(s) > 0).
func standInPieceLen(s string) int {
	r, size := rune(s[0]), 1
	if r >= utf8.RuneSelf {
		r, size = utf8.DecodeRuneInString(s)
	}
	switch classOf(r) {
	case classLetter:
		return runLen(s, classLetter, standInMaxPiece)
	case classDigit:
		return runLen(s, classDigit, standInMaxDigits)
	case classSpace:
		if r == ' ' && startsWord(s[1:]) {
			return 1 + runLen(s[1:], classLetter, standInMaxPiece)
		}
		// A whitespace run ends before a space that starts a word, so
		// "a  b" splits as "a", " ", " b" and the word keeps its space.
		n := runLen(s, classSpace, len(s))
		if n > 1 && s[n-1] == ' ' && startsWord(s[n:]) {
			n--
		}
		return n
	}
	return size
}

// runeClass is what a rune contributes to a stand-in piece.
type runeClass uint8

const (
	classOther runeClass = iota
	classLetter
	classDigit
	classSpace
)

// standInASCII is classOf for ASCII, where nearly all prompt text lives: a
// table lookup instead of three Unicode range searches per byte.
var standInASCII = func() (t [utf8.RuneSelf]runeClass) {
	for r := range rune(utf8.RuneSelf) {
		t[r] = classOfRune(r)
	}
	return t
}()

func classOf(r rune) runeClass {
	if r < utf8.RuneSelf {
		return standInASCII[r]
	}
	return classOfRune(r)
}

func classOfRune(r rune) runeClass {
	switch {
	// CJK ideographs are one token each, as in real vocabularies.
	case (unicode.IsLetter(r) || unicode.IsMark(r)) && !unicode.Is(unicode.Han, r):
		return classLetter
	case unicode.IsDigit(r):
		return classDigit
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

func startsWord(s string) bool {
	if s == "" {
		return false
	}
	if s[0] < utf8.RuneSelf {
		return standInASCII[s[0]] == classLetter
	}
	r, _ := utf8.DecodeRuneInString(s)
	return classOfRune(r) == classLetter
}

// runLen returns the byte length of the longest prefix of s, at most max
// runes, whose runes are all of class c (at least one rune).
func runLen(s string, c runeClass, max int) int {
	n, count := 0, 0
	for n < len(s) && count < max {
		if b := s[n]; b < utf8.RuneSelf {
			if standInASCII[b] != c {
				break
			}
			n++
			count++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[n:])
		if classOfRune(r) != c {
			break
		}
		n += size
		count++
	}
	if n == 0 {
		_, n = utf8.DecodeRuneInString(s)
	}
	return n
}

func standInPieceID(piece string) uint32 {
	return uint32(xxhash.Sum64String(piece) % standInVocab)
}

// RenderStandInChat renders messages and tools the way Qwen2.5/Qwen3's ChatML
// template does (tools listed in a system block, assistant tool calls inside
// <tool_call> tags, tool results as user turns), and is used with StandIn
// until a model's own template is loaded. Each turn's rendering is a prefix of
// the next turn's, so multi-turn conversations share KV-cache prefixes as
// they do on a real engine.
func RenderStandInChat(msgs []openai.Message, tools []openai.Tool, addGenerationPrompt bool) (string, error) {
	b, err := AppendStandInChat(nil, msgs, tools, addGenerationPrompt)
	if err != nil {
		return "", err
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), nil // b is never written again
}

// AppendStandInChat appends RenderStandInChat's text to b, so that a
// caller rendering request after request can reuse one buffer
// (TestAppendStandInChat). On error it returns b unchanged in length.
func AppendStandInChat(b []byte, msgs []openai.Message, tools []openai.Tool, addGenerationPrompt bool) ([]byte, error) {
	// A raw JSON string is at least as long as the text it decodes to, so
	// this is room for the whole prompt, grown once; each message's text
	// is decoded straight into it.
	size := 64
	for i := range msgs {
		size += len(msgs[i].Content) + 32
	}
	for _, t := range tools {
		size += len(t.Function.Name) + len(t.Function.Description) + len(t.Function.Parameters) + 64
	}
	b = slices.Grow(b, size)
	b0 := len(b)
	var err error
	first := 0
	if len(tools) > 0 {
		b = append(b, "<|im_start|>system\n"...)
		if len(msgs) > 0 && msgs[0].Role == "system" {
			if b, err = msgs[0].AppendContentText(b); err != nil {
				return b[:b0], fmt.Errorf("message 0: %w", err)
			}
			b = append(b, "\n\n"...)
			first = 1
		}
		b = append(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>"...)
		for _, t := range tools {
			// The schema keeps the client's key order: it is embedded raw.
			b = fmt.Appendf(b, "\n{\"type\": \"function\", \"function\": {\"name\": %q, \"description\": %q, \"parameters\": %s}}",
				t.Function.Name, t.Function.Description, rawOrEmptyObject(t.Function.Parameters))
		}
		b = append(b, "\n</tools><|im_end|>\n"...)
	}
	for i := first; i < len(msgs); i++ {
		m := &msgs[i]
		switch m.Role {
		case "system", "user", "assistant", "developer":
			b = append(b, "<|im_start|>"...)
			b = append(b, m.Role...)
			b = append(b, '\n')
			at := len(b)
			if b, err = m.AppendContentText(b); err != nil {
				return b[:b0], fmt.Errorf("message %d: %w", i, err)
			}
			hasText := len(b) > at
			for j, tc := range m.ToolCalls {
				if j > 0 || hasText {
					b = append(b, '\n')
				}
				b = fmt.Appendf(b, "<tool_call>\n{\"name\": %q, \"arguments\": %s}\n</tool_call>", tc.Function.Name, rawOrEmptyObject([]byte(tc.Function.Arguments)))
			}
			b = append(b, "<|im_end|>\n"...)
		case "tool":
			b = append(b, "<|im_start|>user\n<tool_response>\n"...)
			if b, err = m.AppendContentText(b); err != nil {
				return b[:b0], fmt.Errorf("message %d: %w", i, err)
			}
			b = append(b, "\n</tool_response><|im_end|>\n"...)
		default:
			return b[:b0], fmt.Errorf("message %d: unknown role %q", i, m.Role)
		}
	}
	if addGenerationPrompt {
		b = append(b, "<|im_start|>assistant\n"...)
	}
	return b, nil
}

func rawOrEmptyObject(raw []byte) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "{}"
	}
	return string(raw)
}
