package tokenizer

import "unsafe"

// hugePage is the size of a transparent huge page on amd64 and arm64
// Linux with 4 KiB base pages.
const hugePage = 2 << 20

// hugeUint64s returns n zeroed words for a table that BPE reads at
// random (the pair table, the characters' entries, the vocab table).
// A cold encode's reads of those tables mostly miss the caches, and with
// 4 KiB pages most also miss the TLB: a table of several MiB spans
// thousands of pages, whose walks (nested under a hypervisor) cost as
// much as the miss itself. A table of at least a huge page therefore
// starts at a huge-page boundary and fills whole huge pages, so that
// adviseHuge can have the kernel back all of it with huge pages, given
// before the table is filled; that costs up to two huge pages of memory
// more. The words hold no pointers, so the collector never scans them;
// a slice into them keeps all of them alive.
func hugeUint64s(n int) []uint64 {
	if n*8 < hugePage {
		return make([]uint64, n)
	}
	pages := (8*n + hugePage - 1) / hugePage
	s := make([]uint64, (pages+1)*hugePage/8)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	off := int(((p+hugePage-1)&^(hugePage-1) - p) / 8)
	adviseHuge(unsafe.Pointer(&s[off]), pages*hugePage)
	return s[off : off+n : off+n]
}
