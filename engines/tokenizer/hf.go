package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// HF is a BPE tokenizer loaded from a Hugging Face tokenizer.json: byte-level
// BPE with a split regex (Qwen2.5/Qwen3, Llama 3.x, GPT-OSS, DeepSeek V3) or
// SentencePiece-style BPE with byte fallback in the legacy Prepend+Replace
// form (Llama 2). Encode gives the ids the Rust tokenizers library gives
// with add_special_tokens=False, which is how vLLM tokenizes a rendered chat
// prompt. Safe for concurrent use.
type HF struct {
	name         string
	split        splitKind
	nfc          bool
	ignoreMerges bool
	// ignore_merges: the longest token, and which word hashes may be
	// tokens (encodeWord).
	maxTokenLen int
	vocabFilter hashFilter
	vocabTab    vocabTable
	vocab       map[string]uint32 // raw bytes of a token -> id
	byteIDs     [256]uint32       // byte-level: the token of each byte
	// Byte-level: where a word starts from each character (chars.go).
	charTok  []charEntry
	charCtxs []charContext
	byteNo   [256]uint64 // charNoLeft, charNoRight of each byte's token

	// SentencePiece-style BPE: "▁" is prepended to every segment and
	// replaces spaces; the symbols are characters.
	spm          bool
	byteFallback bool
	byteToken    [256]uint32 // <0xXX>
	hasByteToken [256]bool
	unk          uint32
	hasUnk       bool
	fuseUnk      bool
	// spmSplit: no token has "▁" after another character, so no merge
	// can cross the start of a "▁" run and words can be split there.
	spmSplit   bool
	merges     pairTable  // left<<32|right -> rank<<32|merged id
	raw        *addedTrie // added tokens matched before normalization
	normalized *addedTrie // added tokens matched after normalization
	added      map[string]uint32
	cache      *wordCache

	// Byte pairs adjacent in a raw or normalized added token: a cut
	// between two such bytes could split a token (see cut.go).
	rawBigrams, normBigrams bigramSet

	chatTemplate string
	bosToken     string
	eosToken     string

	// Ids that add_special_tokens=True puts around a text, or why unknown.
	specialPrefix, specialSuffix []uint32
	specialErr                   error
}

type hfAddedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         struct {
		Type         string            `json:"type"`
		Vocab        map[string]uint32 `json:"vocab"`
		Merges       json.RawMessage   `json:"merges"`
		IgnoreMerges bool              `json:"ignore_merges"`
		ByteFallback bool              `json:"byte_fallback"`
		Dropout      *float64          `json:"dropout"`
		UnkToken     *string           `json:"unk_token"`
		FuseUnk      bool              `json:"fuse_unk"`
		ContPrefix   *string           `json:"continuing_subword_prefix"`
		EndSuffix    *string           `json:"end_of_word_suffix"`
	} `json:"model"`
}

type hfComponent struct {
	Type          string          `json:"type"`
	Normalizers   []hfComponent   `json:"normalizers"`
	Pretokenizers []hfComponent   `json:"pretokenizers"`
	Pattern       json.RawMessage `json:"pattern"`
	Behavior      string          `json:"behavior"`
	Invert        bool            `json:"invert"`
	AddPrefix     bool            `json:"add_prefix_space"`
	Prepend       string          `json:"prepend"`
	Content       string          `json:"content"`
	UseRegex      *bool           `json:"use_regex"`
}

// Load reads tokenizer.json and tokenizer_config.json (and chat_template.jinja
// when present, which wins over the config's template) from dir.
func Load(name, dir string) (*HF, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("cannot read tokenizer: %w", err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cannot read tokenizer config: %w", err)
	}
	t, err := Parse(name, tj, cfg)
	if err != nil {
		return nil, err
	}
	if tmpl, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		t.chatTemplate = string(tmpl)
	}
	return t, nil
}

// Parse builds a tokenizer from the contents of tokenizer.json and
// tokenizer_config.json (config may be empty).
func Parse(name string, tokenizerJSON, configJSON []byte) (*HF, error) {
	var f hfFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("cannot decode tokenizer.json: %w", err)
	}
	if f.Model.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer model %q is not supported (want BPE)", f.Model.Type)
	}
	if f.Model.Dropout != nil ||
		(f.Model.ContPrefix != nil && *f.Model.ContPrefix != "") || (f.Model.EndSuffix != nil && *f.Model.EndSuffix != "") {
		return nil, errors.New("BPE with dropout or subword affixes is not supported")
	}
	initClasses()
	t := &HF{name: name, ignoreMerges: f.Model.IgnoreMerges, cache: newWordCache()}
	if isSPMNormalizer(f.Normalizer) && (len(f.PreTokenizer) == 0 || string(f.PreTokenizer) == "null") {
		t.spm, t.byteFallback, t.fuseUnk = true, f.Model.ByteFallback, f.Model.FuseUnk
		if err := t.buildSPMVocab(f.Model.Vocab, f.Model.Merges, f.Model.UnkToken); err != nil {
			return nil, err
		}
	} else {
		if f.Model.ByteFallback {
			return nil, errors.New("byte_fallback is only supported with the SentencePiece-style normalizer")
		}
		var err error
		if t.nfc, err = parseNormalizer(f.Normalizer); err != nil {
			return nil, err
		}
		if t.split, err = parsePreTokenizer(f.PreTokenizer); err != nil {
			return nil, err
		}
		if err := t.buildVocab(f.Model.Vocab, f.Model.Merges); err != nil {
			return nil, err
		}
	}
	t.added = make(map[string]uint32, len(f.AddedTokens))
	var raw, normed []hfAddedToken
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			continue
		}
		if a.SingleWord || a.LStrip || a.RStrip {
			return nil, fmt.Errorf("added token %q uses single_word/lstrip/rstrip, which is not supported", a.Content)
		}
		t.added[a.Content] = a.ID
		if a.Normalized && (t.spm || (t.nfc && !norm.NFC.IsNormalString(a.Content))) {
			// The reference normalizes such a token's content before
			// matching; only identity-normalized contents are supported.
			return nil, fmt.Errorf("added token %q is normalized by the normalizer, which is not supported", a.Content)
		}
		if a.Normalized {
			normed = append(normed, a)
			t.normBigrams.addAll(a.Content)
		} else {
			raw = append(raw, a)
			t.rawBigrams.addAll(a.Content)
		}
	}
	t.raw, t.normalized = newAddedTrie(raw), newAddedTrie(normed)
	t.specialPrefix, t.specialSuffix, t.specialErr = parsePostProcessor(f.PostProcessor)
	if len(bytes.TrimSpace(configJSON)) > 0 {
		if err := t.parseConfig(configJSON); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// parsePostProcessor finds the special tokens a TemplateProcessing puts
// around a single sequence; ByteLevel and no processor add none.
func parsePostProcessor(raw json.RawMessage) (prefix, suffix []uint32, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil, nil
	}
	type piece struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	}
	type processor struct {
		Type          string      `json:"type"`
		Processors    []processor `json:"processors"`
		Single        []piece     `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
	}
	var p processor
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, nil, fmt.Errorf("cannot decode post_processor: %w", err)
	}
	procs := []processor{p}
	if p.Type == "Sequence" {
		procs = p.Processors
	}
	for _, p := range procs {
		switch p.Type {
		case "ByteLevel":
		case "TemplateProcessing":
			seen := false
			for _, pc := range p.Single {
				switch {
				case pc.Sequence != nil:
					seen = true
				case pc.SpecialToken != nil:
					st, ok := p.SpecialTokens[pc.SpecialToken.ID]
					if !ok {
						return nil, nil, fmt.Errorf("post_processor template names unknown token %q", pc.SpecialToken.ID)
					}
					if seen {
						suffix = append(suffix, st.IDs...)
					} else {
						prefix = append(prefix, st.IDs...)
					}
				}
			}
		default:
			return nil, nil, fmt.Errorf("post_processor %q is not supported", p.Type)
		}
	}
	return prefix, suffix, nil
}

// EncodeWithSpecialTokens is Encode with add_special_tokens=True, as vLLM
// tokenizes a /v1/completions prompt: the BOS/EOS the model's tokenizer adds
// around the text (Llama 3.x, Llama 2 and DeepSeek V3 prepend BOS; Qwen3 and
// GPT-OSS add nothing).
func (t *HF) EncodeWithSpecialTokens(dst []uint32, text string) ([]uint32, error) {
	if t.specialErr != nil {
		return dst, t.specialErr
	}
	dst = append(dst, t.specialPrefix...)
	dst = t.Encode(dst, text)
	return append(dst, t.specialSuffix...), nil
}

// isSPMNormalizer reports the legacy SentencePiece normalizer:
// Sequence[Prepend("▁"), Replace(" ", "▁")].
func isSPMNormalizer(raw json.RawMessage) bool {
	var c hfComponent
	if json.Unmarshal(raw, &c) != nil || c.Type != "Sequence" || len(c.Normalizers) != 2 {
		return false
	}
	p, r := c.Normalizers[0], c.Normalizers[1]
	var pat struct {
		String *string `json:"String"`
	}
	return p.Type == "Prepend" && p.Prepend == "▁" && r.Type == "Replace" && r.Content == "▁" &&
		json.Unmarshal(r.Pattern, &pat) == nil && pat.String != nil && *pat.String == " "
}

func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return false, nil
	}
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return false, fmt.Errorf("cannot decode normalizer: %w", err)
	}
	switch {
	case c.Type == "NFC":
		return true, nil
	case c.Type == "Sequence" && len(c.Normalizers) == 0:
		return false, nil
	case c.Type == "Sequence" && len(c.Normalizers) == 1 && c.Normalizers[0].Type == "NFC":
		return true, nil
	}
	return false, fmt.Errorf("normalizer %s is not supported", raw)
}

func parsePreTokenizer(raw json.RawMessage) (splitKind, error) {
	var c hfComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return 0, fmt.Errorf("cannot decode pre_tokenizer: %w", err)
	}
	if c.Type != "Sequence" || len(c.Pretokenizers) < 2 {
		return 0, fmt.Errorf("pre_tokenizer %.200s is not supported", raw)
	}
	last := c.Pretokenizers[len(c.Pretokenizers)-1]
	if last.Type != "ByteLevel" || last.AddPrefix || last.UseRegex == nil || *last.UseRegex {
		return 0, fmt.Errorf("pre_tokenizer must end in ByteLevel without prefix space or regex, got %.200s", raw)
	}
	var pats []string
	for _, p := range c.Pretokenizers[:len(c.Pretokenizers)-1] {
		var pat struct {
			Regex string `json:"Regex"`
		}
		if p.Type != "Split" || p.Behavior != "Isolated" || p.Invert || json.Unmarshal(p.Pattern, &pat) != nil || pat.Regex == "" {
			return 0, fmt.Errorf("pre_tokenizer step %s is not supported", p.Type)
		}
		pats = append(pats, pat.Regex)
	}
	switch strings.Join(pats, "\x00") {
	case patQwen:
		return splitQwen, nil
	case patLlama3:
		return splitLlama3, nil
	case patO200k:
		return splitO200k, nil
	case patDSDigits + "\x00" + patDSCJK + "\x00" + patDSMain:
		return splitDeepSeek, nil
	}
	return 0, fmt.Errorf("split pattern %q has no hand-written pre-tokenizer", strings.Join(pats, " then "))
}

// byteLevelDecode maps the printable runes of GPT-2's byte-level alphabet
// back to bytes.
var byteLevelDecode = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[rune(b)] = byte(b)
		} else {
			m[rune(256+n)] = byte(b)
			n++
		}
	}
	return m
}()

func fromByteLevel(tok string) (string, bool) {
	b := make([]byte, 0, len(tok))
	for _, r := range tok {
		c, ok := byteLevelDecode[r]
		if !ok {
			return "", false
		}
		b = append(b, c)
	}
	return string(b), true
}

func (t *HF) buildVocab(vocab map[string]uint32, mergesRaw json.RawMessage) error {
	t.vocab = make(map[string]uint32, len(vocab))
	for tok, id := range vocab {
		if raw, ok := fromByteLevel(tok); ok {
			t.vocab[raw] = id
		}
	}
	for b := 0; b < 256; b++ {
		id, ok := t.vocab[string([]byte{byte(b)})]
		if !ok {
			return fmt.Errorf("byte-level vocab lacks byte %#x", b)
		}
		t.byteIDs[b] = id
	}
	pairs, err := parseMerges(mergesRaw)
	if err != nil {
		return err
	}
	if err := t.buildMerges(vocab, pairs); err != nil {
		return err
	}
	t.buildCharStart()
	if t.ignoreMerges {
		t.buildWholeWords()
	}
	t.vocab = nil // byte-level encoding reads vocabTab only
	return nil
}

func (t *HF) buildSPMVocab(vocab map[string]uint32, mergesRaw json.RawMessage, unk *string) error {
	t.vocab = vocab
	_, t.spmSplit = vocab["▁"] // a lone "▁" never becomes unk, so unk runs never span a cut
	for tok := range vocab {
		if spaceAfterChar(tok) {
			t.spmSplit = false
			break
		}
	}
	for b := 0; b < 256; b++ {
		t.byteToken[b], t.hasByteToken[b] = vocab[fmt.Sprintf("<0x%02X>", b)]
	}
	if unk != nil {
		t.unk, t.hasUnk = vocab[*unk]
	}
	pairs, err := parseMerges(mergesRaw)
	if err != nil {
		return err
	}
	return t.buildMerges(vocab, pairs)
}

// spaceAfterChar reports whether "▁" follows another character in tok.
func spaceAfterChar(tok string) bool {
	other := false
	for _, r := range tok {
		if r != '▁' {
			other = true
		} else if other {
			return true
		}
	}
	return false
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		pairs = make([][2]string, len(asStrings))
		for i, m := range asStrings {
			l, r, ok := strings.Cut(m, " ")
			if !ok {
				return nil, fmt.Errorf("merge %d %q has no space", i, m)
			}
			pairs[i] = [2]string{l, r}
		}
		return pairs, nil
	}
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("cannot decode merges: %w", err)
	}
	return pairs, nil
}

func (t *HF) buildMerges(vocab map[string]uint32, pairs [][2]string) error {
	maxID := uint32(0)
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	if err := pairTableFits(maxID, len(pairs)); err != nil {
		return err
	}
	t.merges = newPairTable(len(pairs))
	for rank, p := range pairs {
		l, ok1 := vocab[p[0]]
		r, ok2 := vocab[p[1]]
		m, ok3 := vocab[p[0]+p[1]]
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("merge %d %q refers to a token missing from the vocab", rank, p)
		}
		t.merges.putNew(uint64(l)<<32|uint64(r), uint64(rank)<<32|uint64(m))
	}
	t.merges.markEnds()
	return nil
}

// tokenString is a special token in tokenizer_config.json: a string or an
// AddedToken object with content.
type tokenString string

func (s *tokenString) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, (*string)(s))
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	*s = tokenString(o.Content)
	return nil
}

func (t *HF) parseConfig(b []byte) error {
	var c struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          tokenString     `json:"bos_token"`
		EOS          tokenString     `json:"eos_token"`
		AddBOS       *bool           `json:"add_bos_token"`
		AddEOS       *bool           `json:"add_eos_token"`
		Class        string          `json:"tokenizer_class"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("cannot decode tokenizer_config.json: %w", err)
	}
	t.bosToken, t.eosToken = string(c.BOS), string(c.EOS)
	// Transformers' Llama tokenizers rebuild the post-processor from
	// add_bos_token/add_eos_token (DeepSeek V3 relies on this for its BOS).
	if strings.HasPrefix(c.Class, "LlamaTokenizer") && (c.AddBOS != nil || c.AddEOS != nil) {
		t.specialPrefix, t.specialSuffix, t.specialErr = nil, nil, nil
		add := func(on *bool, def bool, tok string) ([]uint32, error) {
			if (on == nil && !def) || (on != nil && !*on) {
				return nil, nil
			}
			id, ok := t.added[tok]
			if !ok {
				return nil, fmt.Errorf("special token %q is not an added token", tok)
			}
			return []uint32{id}, nil
		}
		if t.specialPrefix, t.specialErr = add(c.AddBOS, true, t.bosToken); t.specialErr == nil {
			t.specialSuffix, t.specialErr = add(c.AddEOS, false, t.eosToken)
		}
	}
	ct := bytes.TrimSpace(c.ChatTemplate)
	switch {
	case len(ct) == 0 || bytes.Equal(ct, []byte("null")):
	case ct[0] == '"':
		if err := json.Unmarshal(ct, &t.chatTemplate); err != nil {
			return fmt.Errorf("cannot decode chat_template: %w", err)
		}
	default:
		// A list of named templates: the engines use "default".
		var named []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if err := json.Unmarshal(ct, &named); err != nil {
			return fmt.Errorf("cannot decode chat_template: %w", err)
		}
		for _, n := range named {
			if n.Name == "default" {
				t.chatTemplate = n.Template
			}
		}
	}
	return nil
}

// Name returns the name given at load time.
func (t *HF) Name() string { return t.name }

// AddedToken returns the id of an added token (e.g. "<|im_start|>").
func (t *HF) AddedToken(content string) (uint32, bool) {
	id, ok := t.added[content]
	return id, ok
}

// Encode appends the ids of text, matching added tokens first, as the
// reference does with add_special_tokens=False.
func (t *HF) Encode(dst []uint32, text string) []uint32 {
	return t.encode(dst, text, false, nil, nil)
}

// splitAdded implements Restarting: the added tokens matched before
// normalization are the ones encoding never looks across.
func (t *HF) splitAdded(s string, emit func(seg string, id int32)) { t.raw.split(s, emit) }

// encode implements Restarting. Each segment between added tokens is
// encoded in pieces split at mids, each piece on its own (a continuation
// of its segment after the first): the cuts nextCut gives are exactly the
// points where that changes nothing.
func (t *HF) encode(dst []uint32, text string, cont bool, mids []int, cut func(end, n int)) []uint32 {
	pos := 0
	t.raw.split(text, func(seg string, id int32) {
		start := pos
		pos += len(seg)
		if id >= 0 {
			dst = append(dst, uint32(id))
			cont = false
			if cut != nil {
				cut(pos, len(dst))
			}
			return
		}
		for len(mids) > 0 && mids[0] < pos {
			k := mids[0] - start
			dst = t.encodeSegment(dst, seg[:k], cont)
			cut(mids[0], len(dst))
			seg, start, cont, mids = seg[k:], mids[0], true, mids[1:]
		}
		dst = t.encodeSegment(dst, seg, cont)
		cont = false
	})
	return dst
}

// encodeSegment encodes text between added tokens; cont says it continues
// a segment cut at a cut point, so the SentencePiece-style normalizer
// prepends nothing.
func (t *HF) encodeSegment(dst []uint32, seg string, cont bool) []uint32 {
	if t.nfc {
		seg = toNFC(seg)
	}
	if t.spm {
		if cont {
			seg = strings.ReplaceAll(seg, " ", "▁")
		} else {
			seg = "▁" + strings.ReplaceAll(seg, " ", "▁")
		}
	}
	t.normalized.split(seg, func(seg string, id int32) {
		if id >= 0 {
			dst = append(dst, uint32(id))
			return
		}
		if t.spm {
			dst = t.encodeSPM(dst, seg)
			return
		}
		t.split.preTokenize(seg, func(word string) {
			dst = t.encodeWord(dst, word)
		})
	})
	return dst
}
