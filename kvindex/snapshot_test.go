package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/kvevents"
)

// fleet is a few replicas' states in one index, as an EPP holds them.
type fleet struct {
	ix     *Index
	ids    *IDs
	states map[string]*ReplicaState
	tags   map[string]ReplicaTag
	// prompts are token sequences the states hold prefixes of.
	prompts [][]uint32
}

// newFleet builds n replicas from engine events: chains of 4-12 blocks, a
// shared prefix, a LoRA root and a salted root, CPU copies and removals.
func newFleet(t testing.TB, n int, seed uint64) *fleet {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	f := &fleet{ix: New(Config{}), ids: NewIDs(), states: map[string]*ReplicaState{}, tags: map[string]ReplicaTag{}}
	shared := randTokens(rng, 3*16)
	for r := 0; r < n; r++ {
		name := fmt.Sprintf("10.0.0.%d:8000", r+1)
		id, err := f.ids.Assign(name)
		require.NoError(t, err)
		s := NewReplicaState(f.ix, id, testModel)
		base := uint64(r+1) << 40
		hash := base + 16
		var events []kvevents.Event
		for c := 0; c < 6; c++ {
			toks := append(append([]uint32(nil), shared...), randTokens(rng, 16*(1+rng.IntN(9)))...)
			f.prompts = append(f.prompts, toks)
			hashes := make([]uint64, len(toks)/16)
			for i := range hashes {
				// The engine hashes the shared prefix alike in every chain
				// (LoRA and salt change the root, so their chains do not).
				if i < len(shared)/16 && c < 4 {
					hashes[i] = base + uint64(i) + 1
					continue
				}
				hash++
				hashes[i] = hash
			}
			ev := stored(hashes, 0, toks, "GPU")
			switch c {
			case 4:
				ev.LoraName = "sql"
			case 5:
				ev.CacheSalt = "tenant-7"
			}
			events = append(events, ev)
			if c == 1 {
				events = append(events, stored(hashes, 0, toks, "CPU"), removed(hashes[len(hashes)-1:], "GPU"))
			}
			if c == 2 {
				events = append(events, removed(hashes[len(hashes)-2:], "GPU"))
			}
		}
		s.ApplyBatch(&kvevents.Batch{Events: events})
		require.Zero(t, s.Stats().Malformed)
		f.states[name] = s
		f.tags[name] = ReplicaTag{Name: name, Pos: kvevents.Position{Seq: uint64(100 + r), Sum: uint64(7 * r)}}
	}
	return f
}

// encode writes the fleet's snapshot.
func (f *fleet) encode(t testing.TB, h SnapshotHeader) []byte {
	return f.encodeVersion(t, h, SnapshotVersion)
}

func (f *fleet) encodeVersion(t testing.TB, h SnapshotHeader, version uint16) []byte {
	var buf bytes.Buffer
	sw := newSnapshotWriter(&buf, h, version)
	for i := 0; i < len(f.states); i++ {
		name := fmt.Sprintf("10.0.0.%d:8000", i+1)
		require.NoError(t, sw.AddReplica(f.tags[name], f.states[name]))
		require.NoError(t, sw.Flush())
	}
	require.NoError(t, sw.Close())
	return buf.Bytes()
}

var testHeader = SnapshotHeader{BlockSize: 16, Pool: "llm/pool"}

func (f *fleet) load(data []byte) (*Snapshot, error) {
	return LoadSnapshot(bytes.NewReader(data), LoadOptions{Want: testHeader, MaxBytes: 1 << 20, Assign: f.ids.Assign})
}

// dump is a replica state as a comparable value: engine hash -> block.
func dump(s *ReplicaState) map[uint64]string {
	out := map[uint64]string{}
	for h, b := range s.blocks {
		out[h] = fmt.Sprint(b.key, b.parent, b.hasParent, b.tiers, s.tokens.at(b.tok), s.roots[h])
	}
	return out
}

// TestSnapshotRoundTrip: a loaded snapshot holds what its sender held, with
// the receiver's own keys, answers every lookup the same, and keeps
// following engine events.
func TestSnapshotRoundTrip(t *testing.T) {
	f := newFleet(t, 3, 1)
	data := f.encode(t, testHeader)
	snap, err := f.load(data)
	require.NoError(t, err)
	require.Len(t, snap.Replicas, 3)
	require.Equal(t, int64(len(data)), snap.Bytes)
	total := 0
	for _, lr := range snap.Replicas {
		src := f.states[lr.Name]
		require.Equal(t, f.tags[lr.Name], lr.ReplicaTag)
		require.Equal(t, src.Replica(), lr.State.Replica(), "ids come from Assign")
		require.Equal(t, dump(src), dump(lr.State), lr.Name)
		require.Equal(t, src.ix.Resident(src.r), snap.Index.Resident(lr.State.r))
		for tier := Tier(0); tier < NumTiers; tier++ {
			require.Equal(t, src.ix.ResidentTier(src.r, tier), snap.Index.ResidentTier(lr.State.r, tier))
		}
		total += len(src.blocks)
	}
	require.Equal(t, total, snap.Blocks)
	st, want := snap.Index.Stats(), f.ix.Stats()
	require.Equal(t, want.Keys, st.Keys)
	require.Equal(t, want.Residencies, st.Residencies)
	for _, lora := range []string{"", "sql"} {
		for _, salt := range []string{"", "tenant-7"} {
			for _, p := range f.prompts {
				keys := AppendBlockKeys(nil, RootKey(testModel, lora, salt), p, 16)
				require.Equal(t, norm(f.ix.Match(keys, nil)), norm(snap.Index.Match(keys, nil)))
			}
		}
	}
	checkInvariants(t, snap.Index)

	// The loaded state follows the engine on: a removal by engine hash and
	// a store chained onto a loaded block.
	s := snap.Replicas[0].State
	var last uint64
	for h, b := range s.blocks {
		if b.hasParent && b.tiers == 1<<TierGPU {
			last = h
			break
		}
	}
	require.NotZero(t, last)
	before := snap.Index.Resident(s.r)
	s.ApplyBatch(&kvevents.Batch{Events: []kvevents.Event{
		stored([]uint64{1<<60 + 1}, last, randTokens(rand.New(rand.NewPCG(5, 6)), 16), "GPU"),
		removed([]uint64{last}, "GPU"),
	}})
	require.Equal(t, before, snap.Index.Resident(s.r))
	require.Zero(t, s.Stats().UnknownParent)
	require.Zero(t, s.Stats().UnknownRemoved)
	checkInvariants(t, snap.Index)
}

// TestSnapshotOrphans: a block whose parent the engine removed while the
// block stayed cannot be rebuilt; it and its descendants are left out and
// counted, the rest loads.
func TestSnapshotOrphans(t *testing.T) {
	toks := randTokens(rand.New(rand.NewPCG(41, 42)), 4*16)
	ix := New(Config{})
	s := NewReplicaState(ix, 0, testModel)
	s.ApplyBatch(&kvevents.Batch{Events: []kvevents.Event{
		stored([]uint64{1, 2, 3, 4}, 0, toks, "GPU"),
		removed([]uint64{2}, "GPU"),
	}})
	var buf bytes.Buffer
	sw := NewSnapshotWriter(&buf, testHeader)
	require.NoError(t, sw.AddReplica(ReplicaTag{Name: "a:1"}, s))
	require.NoError(t, sw.Close())
	replicas, blocks, skipped := sw.Stats()
	require.Equal(t, []int{1, 1, 2}, []int{replicas, blocks, skipped})
	snap, err := LoadSnapshot(&buf, LoadOptions{Want: testHeader})
	require.NoError(t, err)
	require.Equal(t, 1, snap.Index.Resident(snap.Replicas[0].State.r))
	keys := AppendBlockKeys(nil, RootKey(testModel, "", ""), toks, 16)
	require.Equal(t, []Match{m(snap.Replicas[0].State.r, 1, 0, 0)}, norm(snap.Index.Match(keys, nil)))

	// An empty state loads as an empty replica, its position kept.
	buf.Reset()
	sw = NewSnapshotWriter(&buf, testHeader)
	require.NoError(t, sw.AddReplica(ReplicaTag{Name: "b:1", Pos: kvevents.Position{Seq: 9}}, NewReplicaState(ix, 1, testModel)))
	require.NoError(t, sw.Close())
	snap, err = LoadSnapshot(&buf, LoadOptions{Want: testHeader})
	require.NoError(t, err)
	require.Len(t, snap.Replicas, 1)
	require.Equal(t, uint64(9), snap.Replicas[0].Pos.Seq)
	require.Zero(t, snap.Blocks)
}

// frames splits a snapshot into its preamble and frames (raw bytes).
func frames(t *testing.T, data []byte) [][]byte {
	out := [][]byte{data[:len(snapshotMagic)+2]}
	for rest := data[len(out[0]):]; len(rest) > 0; {
		n := frameHeadLen + int(binary.BigEndian.Uint32(rest[1:])) + frameCRCLen
		require.LessOrEqual(t, n, len(rest))
		out = append(out, rest[:n])
		rest = rest[n:]
	}
	return out
}

func join(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestSnapshotRefused: every snapshot that is not whole, intact, within
// bounds and of this EPP's kind is refused with an error saying which, and
// yields nothing.
func TestSnapshotRefused(t *testing.T) {
	f := newFleet(t, 2, 7)
	good := f.encode(t, testHeader)
	fr := frames(t, good)
	require.Equal(t, byte(frameHeader), fr[1][0])
	require.Equal(t, byte(frameReplica), fr[2][0])
	require.Equal(t, byte(frameTrailer), fr[len(fr)-1][0])
	var blockFrame, secondReplica int
	for i, p := range fr[3:] {
		if p[0] == frameBlocks && blockFrame == 0 {
			blockFrame = i + 3
		}
		if p[0] == frameReplica && secondReplica == 0 {
			secondReplica = i + 3
		}
	}
	require.NotZero(t, blockFrame)
	require.NotZero(t, secondReplica)
	flip := func(i int) []byte {
		b := bytes.Clone(good)
		b[i] ^= 0x40
		return b
	}
	other := func(h SnapshotHeader) []byte { return f.encode(t, h) }
	// A well-formed frame with wrong content (its CRC recomputed).
	reframe := func(kind byte, payload []byte) []byte { return appendFrame(nil, kind, payload) }
	trailer := fr[len(fr)-1]

	tests := []struct {
		name string
		data []byte
		max  int64
		want error
	}{
		{"empty", nil, 0, ErrSnapshotTruncated},
		{"not a snapshot", []byte("<html>502 Bad Gateway</html>"), 0, ErrSnapshotForeign},
		{"other format version", join([]byte(snapshotMagic), []byte{0, 3}, good[len(snapshotMagic)+2:]), 0, ErrSnapshotForeign},
		{"version 1 with elided parents", join([]byte(snapshotMagic), []byte{0, 1}, good[len(snapshotMagic)+2:]), 0, ErrSnapshotCorrupt},
		{"other block size", other(SnapshotHeader{BlockSize: 64, Pool: testHeader.Pool}), 0, ErrSnapshotForeign},
		{"other pool", other(SnapshotHeader{BlockSize: 16, Pool: "llm/other"}), 0, ErrSnapshotForeign},
		{"cut in the preamble", good[:5], 0, ErrSnapshotTruncated},
		{"cut inside a frame", good[:len(join(fr[:blockFrame]...))+100], 0, ErrSnapshotTruncated},
		{"cut between frames", join(fr[:secondReplica]...), 0, ErrSnapshotTruncated},
		{"no trailer", good[:len(good)-len(trailer)], 0, ErrSnapshotTruncated},
		{"byte flipped in a record", flip(len(join(fr[:blockFrame]...)) + 40), 0, ErrSnapshotCorrupt},
		{"byte flipped in the trailer", flip(len(good) - 6), 0, ErrSnapshotCorrupt},
		{"frame length corrupted", flip(len(join(fr[:blockFrame]...)) + 1), 0, ErrSnapshotCorrupt},
		{"a block frame lost", join(append(fr[:blockFrame:blockFrame], fr[blockFrame+1:]...)...), 0, ErrSnapshotCorrupt},
		{"a replica repeated", join(append(append(fr[:secondReplica:secondReplica], fr[2:secondReplica]...), fr[secondReplica:]...)...), 0, ErrSnapshotCorrupt},
		{"trailer counts wrong", join(append(fr[:len(fr)-1:len(fr)-1], reframe(frameTrailer, []byte{9, 9, 0, 0, 0, 0, 0, 0, 0, 0}))...), 0, ErrSnapshotCorrupt},
		{"data after the trailer", join(good, []byte{0}), 0, ErrSnapshotCorrupt},
		{"unknown frame", join(append(fr[:2:2], append([][]byte{reframe('X', nil)}, fr[2:]...)...)...), 0, ErrSnapshotCorrupt},
		{"over the size limit", good, int64(len(good) - 1), ErrSnapshotTooLarge},
		{"oversize frame", join(fr[0], fr[1], []byte{frameBlocks, 0x7f, 0, 0, 0}), 0, ErrSnapshotCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			max := tt.max
			if max == 0 {
				max = 1 << 20
			}
			snap, err := LoadSnapshot(bytes.NewReader(tt.data), LoadOptions{Want: testHeader, MaxBytes: max})
			require.ErrorIs(t, err, tt.want)
			require.Nil(t, snap, "nothing of a refused snapshot is handed out")
		})
	}
	t.Run("exactly at the size limit", func(t *testing.T) {
		_, err := LoadSnapshot(bytes.NewReader(good), LoadOptions{Want: testHeader, MaxBytes: int64(len(good))})
		require.NoError(t, err)
	})
	t.Run("every truncation", func(t *testing.T) {
		for n := 0; n < len(good); n += 1 + n/64 {
			_, err := LoadSnapshot(bytes.NewReader(good[:n]), LoadOptions{Want: testHeader})
			require.Error(t, err, "cut at %d of %d", n, len(good))
		}
	})
	t.Run("every byte flipped", func(t *testing.T) {
		for i := 0; i < len(good); i += 1 + i/64 {
			_, err := LoadSnapshot(bytes.NewReader(flip(i)), LoadOptions{Want: testHeader})
			require.Error(t, err, "byte %d of %d", i, len(good))
		}
	})
	t.Run("a replica with more blocks than a replica may track", func(t *testing.T) {
		_, err := LoadSnapshot(bytes.NewReader(good), LoadOptions{Want: testHeader, Index: Config{MaxReplicaBlocks: 4}})
		require.ErrorIs(t, err, ErrSnapshotTooLarge)
	})
	t.Run("a failing reader", func(t *testing.T) {
		boom := errors.New("connection reset")
		_, err := LoadSnapshot(io.MultiReader(bytes.NewReader(good[:300]), errReader{boom}), LoadOptions{Want: testHeader})
		require.ErrorIs(t, err, boom)
	})
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// TestSnapshotReaderStreams: the reader hands out sections and blocks in
// the sender's order, parents first, and only the verified end is io.EOF.
func TestSnapshotReaderStreams(t *testing.T) {
	f := newFleet(t, 2, 9)
	sr, err := NewSnapshotReader(bytes.NewReader(f.encode(t, testHeader)), 0)
	require.NoError(t, err)
	require.Equal(t, testHeader, sr.Header())
	for i := 0; ; i++ {
		sec, err := sr.NextReplica()
		if errors.Is(err, io.EOF) {
			require.Equal(t, 2, i)
			break
		}
		require.NoError(t, err)
		require.Equal(t, testModel, sec.Model)
		require.Equal(t, 16, sec.BlockSize)
		seen := map[uint64]bool{}
		for {
			b, err := sr.NextBlock()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			require.True(t, !b.HasParent || seen[b.Parent], "parent first")
			seen[b.Hash] = true
		}
		require.Len(t, seen, sec.Blocks)
	}
	_, err = sr.NextReplica()
	require.ErrorIs(t, err, io.EOF)
}

// FuzzSnapshotLoad feeds arbitrary bytes to the snapshot decoder: it must
// never panic, and what it accepts must be consistent.
func FuzzSnapshotLoad(f *testing.F) {
	fl := newFleet(f, 2, 3)
	good := fl.encode(f, testHeader)
	f.Add(good)
	f.Add(good[:len(good)/2])
	var empty bytes.Buffer
	sw := NewSnapshotWriter(&empty, testHeader)
	_ = sw.Close()
	f.Add(empty.Bytes())
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := LoadSnapshot(bytes.NewReader(data), LoadOptions{Want: testHeader, MaxBytes: 1 << 20, Index: Config{MaxReplicaBlocks: 1 << 12}})
		if err != nil {
			require.Nil(t, snap)
			return
		}
		n := 0
		for _, lr := range snap.Replicas {
			require.LessOrEqual(t, snap.Index.Resident(lr.State.r), len(lr.State.blocks))
			n += len(lr.State.blocks)
		}
		require.Equal(t, snap.Blocks, n)
		checkInvariants(t, snap.Index)
	})
}

// TestSnapshotParentElided: version 2 leaves out the parent hash of a
// block that follows its parent, and loads as the version 1 encoding of
// the same replicas does, which is still read.
func TestSnapshotParentElided(t *testing.T) {
	f := newFleet(t, 4, 3)
	v1, v2 := f.encodeVersion(t, testHeader, snapshotVersion1), f.encode(t, testHeader)
	require.Equal(t, []byte{0, 1}, v1[len(snapshotMagic):len(snapshotMagic)+2])
	require.Equal(t, []byte{0, 2}, v2[len(snapshotMagic):len(snapshotMagic)+2])
	children := 0
	for _, s := range f.states {
		for _, b := range s.blocks {
			if b.hasParent {
				children++
			}
		}
	}
	// Most children follow their parent: at least half lose 8 bytes.
	require.Less(t, len(v2), len(v1)-8*children/2)
	var dumps [2]map[string]map[uint64]string
	for i, data := range [][]byte{v1, v2} {
		snap, err := LoadSnapshot(bytes.NewReader(data), LoadOptions{Want: testHeader, Assign: NewIDs().Assign})
		require.NoError(t, err)
		dumps[i] = map[string]map[uint64]string{}
		for _, lr := range snap.Replicas {
			src := dump(f.states[lr.Name])
			got := dump(lr.State)
			require.Equal(t, len(src), len(got), lr.Name)
			dumps[i][lr.Name] = got
		}
		require.Equal(t, f.ix.Stats().Residencies, snap.Index.Stats().Residencies)
	}
	require.Equal(t, dumps[0], dumps[1])
}
