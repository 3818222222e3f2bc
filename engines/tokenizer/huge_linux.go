package tokenizer

import (
	"syscall"
	"unsafe"
)

// madvCollapse is MADV_COLLAPSE (Linux 6.1), which the syscall package
// does not name.
const madvCollapse = 25

// adviseHuge asks the kernel to back the whole huge pages within
// [p, p+size) with transparent huge pages: MADV_HUGEPAGE, which is all
// that the default THP mode "madvise" needs for memory not yet touched,
// then MADV_COLLAPSE for memory already in base pages. Both are advice:
// a kernel without THP or with it off refuses them, and the table works
// the same in base pages (TestHugeTables).
func adviseHuge(p unsafe.Pointer, size int) {
	lo := (uintptr(p) + hugePage - 1) &^ (hugePage - 1)
	hi := (uintptr(p) + uintptr(size)) &^ (hugePage - 1)
	if hi <= lo {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Add(p, lo-uintptr(p))), hi-lo)
	if syscall.Madvise(b, syscall.MADV_HUGEPAGE) == nil {
		_ = syscall.Madvise(b, madvCollapse)
	}
}
