package kvindex

// ResidentTier returns how many blocks replica r holds on tier t: the
// per-tier split of Resident, which the tests check the counters with.
func (ix *Index) ResidentTier(r Replica, t Tier) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if int(r) >= len(ix.counts) || t >= NumTiers {
		return 0
	}
	return int(ix.counts[r].byTier[t])
}
