package tokenizer

import "strings"

// Cut points inside a text between added tokens.
//
// The prefix cache may reuse the ids it holds for a prefix P of a new text
// P+S only where tokenization provably restarts: for every S the rule
// accepts at that point, the ids of P+S must be the ids of P encoded alone
// followed by those of S encoded as the rest of P's segment (for the
// SentencePiece-style family: without the "▁" prepended at a segment's
// start). After an added token that holds for every S. Inside a segment it
// holds at a boundary b = len(P) when three things cannot reach across b:
//
//  1. An added token. Leftmost-longest matching sees a different token at a
//     position j < b only if some token continues P[j:] past b, and such a
//     token contains the two bytes P[b-1], S[0] side by side. So the bytes
//     on either side of b must not be adjacent in any added token
//     (rawBigrams, normBigrams).
//  2. The normalizer. NFC (Qwen) leaves ASCII alone, ASCII is never the
//     second half of a canonical composition and is a starter that stops
//     reordering, so NFC(P+S) = NFC(P) + NFC(S) when the bytes on both sides
//     of b are ASCII, and NFC(P) still ends in P's last byte. NFC(S) starts
//     with S[0] unless S[0] composes with a mark after it: no composition
//     starts with a space, and after a newline the rule asks S[1] to be
//     ASCII too, so the normalized text has the same two bytes at b as the
//     raw one, which check 1 is made on (TestNFCCutAssumptions checks these
//     claims on every rune). The SentencePiece normalizer replaces each
//     space on its own and prepends "▁" once per segment, which the
//     continuation leaves out.
//  3. The pre-tokenizer. None of the split patterns has a look-behind or an
//     anchor, so the words from b on depend only on S, provided a word ends
//     at b; and the words before b are P's own provided no match starting
//     before b reads a byte at b with an outcome that differs from the end
//     of the text. What the alternatives of each pattern test at b, after
//     consuming P's last byte, decides the rules:
//
// Space after a visible ASCII byte (P ends in [!-~], S starts with ' '). A
// match that has consumed a non-space byte goes on only with letters and
// marks (word runs), digits (digit runs), contraction letters ('re, 'll:
// 'e', 'l'), an apostrophe (o200k's trailing contraction), [^\s\p{L}\p{N}]
// or [\p{P}\p{S}] (punctuation runs), or \r, \n, / after a punctuation run;
// the whitespace alternatives start with whitespace, so none of them has
// consumed P's last byte. A space is none of those, nor is the end of the
// text: every match before b ends where it ends in P alone. The stand-in's
// pieces are the same kinds (letter runs of six, digit runs of three,
// single other runes, a space leading a word) and behave alike.
//
// Visible ASCII other than '/' after a newline (P ends in '\n', S starts
// with [!-~] but not '/'). A newline is consumed only by whitespace runs
// (\s*[\r\n]+, \s+(?!\S), \s+, the stand-in's whitespace piece) and by the
// [\r\n]* or [\r\n/]* tail of a punctuation run; letter, digit and
// contraction matches stop before it. Those go on only with whitespace, \r,
// \n or '/', and the look-ahead (?!\S) and the back-off of \s+ that leaves a
// space to the next word only look at positions up to b: S[0] ends them
// exactly as the end of the text does.
//
// DeepSeek V3 splits three times in turn (digit runs, CJK runs, then its
// main pattern); a boundary of the first splits is kept by the later ones,
// and the gaps between their matches may run across b, so b must be a
// boundary of the main pattern on that gap, which the argument above gives
// (its digit and CJK matches stop before a space and before a newline).
// SentencePiece-style BPE (Llama 2) has no pre-tokenizer: the whole segment
// is one word, and b is safe where no merge can cross it: BPE then merges
// each side in the order it would alone (the lowest-ranked pair first, and
// no pair straddles b). With spmSplit no token has "▁" right after another
// character, so no merge joins a character other than "▁" to the "▁" after
// it: a space is a cut after any character that does not normalize to
// "▁", which is a space or a "▁" written in the text (FuzzPrefixCacheEdit
// found the latter). "▁" is in such a vocabulary, so no run of unknown
// characters (fused into one unknown token) spans b either.
//
// The cache only ever probes and stores cuts these functions return; its
// results are checked against plain encoding by TestCutsRestart (every cut
// of the golden corpora), TestPrefixCacheRandomEdits and
// FuzzPrefixCacheEdit.

// bigramSet holds the byte pairs that occur next to each other in a set of
// strings: 64 Ki bits.
type bigramSet [256][4]uint64

func (s *bigramSet) addAll(tok string) {
	for i := 0; i+1 < len(tok); i++ {
		a, b := tok[i], tok[i+1]
		s[a][b>>6] |= 1 << (b & 63)
	}
}

func (s *bigramSet) has(a, b byte) bool { return s[a][b>>6]&(1<<(b&63)) != 0 }

// visible reports printable ASCII other than space.
func visible(b byte) bool { return b > ' ' && b < 0x7f }

// asciiCut returns the first b in [max(from, 1), len(seg)) at which the
// byte-level families and the stand-in restart: a space after a visible
// ASCII byte, or visible ASCII other than '/' after a newline (with nfc,
// followed by ASCII or the segment's end). added reports a pair of bytes
// adjacent in an added token. -1 when there is none.
func asciiCut(seg string, from int, nfc bool, added *bigramSet) int {
	for i := max(from, 1); i < len(seg); i++ {
		c, p := seg[i], seg[i-1]
		switch {
		case c == ' ' && visible(p):
		case p == '\n' && visible(c) && c != '/' && (!nfc || i+1 == len(seg) || seg[i+1] < 0x80):
		default:
			continue
		}
		if !added.has(p, c) {
			return i
		}
	}
	return -1
}

// spmCut returns the first b in [max(from, 1), len(seg)) holding a space
// after a character other than a space or "▁", where a segment normalized
// "▁" by "▁" cannot be merged across (see spmSplit), or -1. In the
// normalized text the space is "▁" (E2 96 81), after the same byte as in
// seg.
func spmCut(seg string, from int, raw, normalized *bigramSet) int {
	const space = "▁"
	for i := max(from, 1); i < len(seg); i++ {
		if seg[i] != ' ' || seg[i-1] == ' ' || strings.HasSuffix(seg[:i], space) {
			continue
		}
		if p := seg[i-1]; !raw.has(p, ' ') && !normalized.has(p, space[0]) {
			return i
		}
	}
	return -1
}

// nextCut implements Restarting.
func (t *HF) nextCut(seg string, from int) int {
	switch {
	case t.spm && t.spmSplit:
		return spmCut(seg, from, &t.rawBigrams, &t.normBigrams)
	case t.spm:
		return -1 // a merge may cross any space: the segment is one word
	}
	// The pair has to be absent from both tries: ASCII is its own NFC.
	for {
		i := asciiCut(seg, from, t.nfc, &t.rawBigrams)
		if i < 0 || !t.normBigrams.has(seg[i-1], seg[i]) {
			return i
		}
		from = i + 1
	}
}

// standInBigrams are the byte pairs of the stand-in's special tokens.
var standInBigrams = func() (s bigramSet) {
	for _, sp := range standInSpecials {
		s.addAll(sp.text)
	}
	return s
}()

// nextCut implements Restarting: the stand-in has no normalizer.
func (StandIn) nextCut(seg string, from int) int {
	return asciiCut(seg, from, false, &standInBigrams)
}
