//go:build !linux

package tokenizer

import "unsafe"

// adviseHuge does nothing where transparent huge pages are not Linux's.
func adviseHuge(p unsafe.Pointer, size int) {}
