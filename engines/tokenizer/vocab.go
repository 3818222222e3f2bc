package tokenizer

// vocabTable is a byte-level vocab (a token's bytes -> its id) without
// pointers: a map of 150,000-200,000 strings is that many objects the
// garbage collector marks in every cycle, for the life of the tokenizer.
// Slots hold a tag of the word's hash and the id; a tag match is checked
// against the token's bytes. TestVocabTable keeps it equal to the map it
// is built from.
type vocabTable struct {
	slots []uint64 // hash tag<<32 | id+1, 0 when empty
	toks  []uint64 // id -> offset<<16 | length of its bytes
	bytes []byte
}

func newVocabTable(vocab map[string]uint32) vocabTable {
	size, maxID, total := 16, uint32(0), 0
	for size < 2*len(vocab) {
		size *= 2
	}
	for tok, id := range vocab {
		maxID = max(maxID, id)
		total += len(tok)
	}
	v := vocabTable{slots: hugeUint64s(size), toks: make([]uint64, maxID+1), bytes: make([]byte, 0, total)}
	for tok, id := range vocab {
		if len(tok) >= 1<<16 {
			continue // longer than any word encodeWord looks up
		}
		v.toks[id] = uint64(len(v.bytes))<<16 | uint64(len(tok))
		v.bytes = append(v.bytes, tok...)
		h := cacheHash(tok)
		mask := uint64(size - 1)
		for i := h & mask; ; i = (i + 1) & mask {
			if v.slots[i] == 0 {
				v.slots[i] = h>>32<<32 | uint64(id+1)
				break
			}
		}
	}
	return v
}

// get returns the id of the token w, whose cacheHash is h.
func (v *vocabTable) get(w string, h uint64) (uint32, bool) {
	if len(v.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(v.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := v.slots[i]
		if s == 0 {
			return 0, false
		}
		if id := uint32(s) - 1; s>>32 == h>>32 && string(v.token(id)) == w {
			return id, true
		}
	}
}

func (v *vocabTable) token(id uint32) []byte {
	t := v.toks[id]
	off := t >> 16
	return v.bytes[off : off+t&0xffff]
}

// each calls f for every token and its id.
func (v *vocabTable) each(f func(tok []byte, id uint32)) {
	for _, s := range v.slots {
		if s != 0 {
			f(v.token(uint32(s)-1), uint32(s)-1)
		}
	}
}
