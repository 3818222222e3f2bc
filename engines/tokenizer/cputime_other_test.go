//go:build !unix

package tokenizer

import "time"

func processCPU() (time.Duration, bool) { return 0, false }
