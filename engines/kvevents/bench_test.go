package kvevents

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// benchBatch is one realistic engine step: 16 requests each filling one
// 16-token block, plus 4 evictions.
func benchBatch() (*Batch, int) {
	b := &Batch{TS: 1795941479.25, HasDPRank: true}
	h := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < 16; i++ {
		toks := make([]uint32, 16)
		for j := range toks {
			toks[j] = uint32(100 + (i*7919+j*104729)%150000)
		}
		parent := h
		h = splitmix64(h)
		b.Events = append(b.Events, Event{Kind: KindBlockStored, BlockHashes: []uint64{h}, ParentHash: parent, HasParent: true,
			TokenIDs: toks, BlockSize: 16, Medium: "GPU", SpecKind: "full_attention"})
	}
	for i := 0; i < 4; i++ {
		h = splitmix64(h)
		b.Events = append(b.Events, Event{Kind: KindBlockRemoved, BlockHashes: []uint64{h}, Medium: "GPU"})
	}
	return b, 20
}

func BenchmarkEncodeEventBatch(b *testing.B) {
	for _, tc := range []struct {
		name string
		f    Format
	}{{"format=array", FormatArray}, {"format=map", FormatMap}} {
		b.Run(tc.name, func(b *testing.B) {
			batch, blocks := benchBatch()
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var err error
				buf, err = AppendBatch(buf[:0], batch, tc.f, HashUint64)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(blocks)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

func BenchmarkDecodeEventBatch(b *testing.B) {
	batch, blocks := benchBatch()
	for _, tc := range []struct {
		name string
		f    Format
		h    HashEncoding
	}{
		{"format=array", FormatArray, HashUint64},
		{"format=map", FormatMap, HashUint64},
		{"format=map/hash=bytes", FormatMap, HashBytes},
	} {
		b.Run(tc.name, func(b *testing.B) {
			payload, err := AppendBatch(nil, batch, tc.f, tc.h)
			if err != nil {
				b.Fatal(err)
			}
			var out Batch
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := DecodeBatch(payload, &out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
		})
	}
	// Reference: the generic msgpack.Decoder walking the same bytes into
	// interface values, i.e. what a Decoder-based reader would start from.
	b.Run("reference=msgpack.Decoder/format=map", func(b *testing.B) {
		payload, err := AppendBatch(nil, batch, FormatMap, HashUint64)
		if err != nil {
			b.Fatal(err)
		}
		rd := bytes.NewReader(payload)
		dec := msgpack.NewDecoder(rd)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			rd.Reset(payload)
			dec.Reset(rd)
			if _, err := dec.DecodeInterfaceLoose(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
	})
}
