package tokenizer

import (
	"sort"
	"strings"
)

// addedTrie finds added tokens leftmost-longest, as the reference's
// Aho-Corasick matcher does.
type addedTrie struct {
	first [256]bool
	nodes []trieNode
	// only is the first byte of every token when they all share one
	// (typically '<'), so split can jump with strings.IndexByte.
	only    byte
	hasOnly bool
}

type trieNode struct {
	edges []trieEdge // sorted by byte
	id    int32      // token id ending here, or -1
}

type trieEdge struct {
	b    byte
	next int32
}

func newAddedTrie(toks []hfAddedToken) *addedTrie {
	t := &addedTrie{nodes: []trieNode{{id: -1}}}
	for _, a := range toks {
		n := int32(0)
		for i := 0; i < len(a.Content); i++ {
			n = t.child(n, a.Content[i])
		}
		t.nodes[n].id = int32(a.ID)
		t.first[a.Content[0]] = true
	}
	distinct := 0
	for b, ok := range t.first {
		if ok {
			distinct++
			t.only = byte(b)
		}
	}
	t.hasOnly = distinct == 1
	return t
}

func (t *addedTrie) child(n int32, b byte) int32 {
	es := t.nodes[n].edges
	i := sort.Search(len(es), func(i int) bool { return es[i].b >= b })
	if i < len(es) && es[i].b == b {
		return es[i].next
	}
	t.nodes = append(t.nodes, trieNode{id: -1})
	c := int32(len(t.nodes) - 1)
	es = append(es, trieEdge{})
	copy(es[i+1:], es[i:])
	es[i] = trieEdge{b: b, next: c}
	t.nodes[n].edges = es
	return c
}

func (t *addedTrie) step(n int32, b byte) int32 {
	for _, e := range t.nodes[n].edges {
		if e.b == b {
			return e.next
		}
		if e.b > b {
			break
		}
	}
	return -1
}

// longest returns the end and id of the longest token starting at i, or -1.
func (t *addedTrie) longest(s string, i int) (int, int32) {
	end, id := -1, int32(-1)
	n := int32(0)
	for j := i; j < len(s); j++ {
		if n = t.step(n, s[j]); n < 0 {
			break
		}
		if t.nodes[n].id >= 0 {
			end, id = j+1, t.nodes[n].id
		}
	}
	return end, id
}

// split calls emit with the text between tokens (id -1) and each token.
func (t *addedTrie) split(s string, emit func(seg string, id int32)) {
	if len(t.nodes) == 1 {
		if s != "" {
			emit(s, -1)
		}
		return
	}
	gap := 0
	for i := 0; i < len(s); i++ {
		if t.hasOnly {
			k := strings.IndexByte(s[i:], t.only)
			if k < 0 {
				break
			}
			i += k
		} else if !t.first[s[i]] {
			continue
		}
		end, id := t.longest(s, i)
		if end < 0 {
			continue
		}
		if gap < i {
			emit(s[gap:i], -1)
		}
		emit(s[i:end], id)
		gap = end
		i = end - 1
	}
	if gap < len(s) {
		emit(s[gap:], -1)
	}
}
