package quoter

import "time"

// OpenUntil is when the current hold-down ends (zero unless open).
func (b *Breaker) OpenUntil() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stateLocked() != BreakerOpen {
		return time.Time{}
	}
	return b.openUntil
}
