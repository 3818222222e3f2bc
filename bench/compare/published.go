package compare

import "github.com/omnious/provider-node/scheduler"

// Published is a published run a preset reproduces: its per-stage figures
// for the routers it raced, printed beside the bench's own.
type Published struct {
	// Source names the publication.
	Source string
	// TokenScale converts its output tok/s into the run's tokens (the
	// preset's k: a scaled run counts scaled tokens).
	TokenScale float64
	Policies   []PublishedPolicy
}

// PublishedPolicy is one published router, set beside the bench policy
// closest to it.
type PublishedPolicy struct {
	// Policy is the bench policy; Name the publication's.
	Policy, Name string
	// Stages are the ladder's stages, warm-up excluded: output tok/s in
	// original tokens, TTFT in milliseconds, and the stage's completed
	// requests, which the summary weighs its p90s by.
	Stages []StageResult
	// Summary is the publication's own summary across stages.
	Summary StageSummary
}

// policy returns the published router beside policy.
func (p *Published) policy(policy string) (PublishedPolicy, bool) {
	if p == nil {
		return PublishedPolicy{}, false
	}
	for _, pp := range p.Policies {
		if pp.Policy == policy {
			return pp, true
		}
	}
	return PublishedPolicy{}, false
}

// llmd73Published is the benchmark report of llm-d's "73% capacity" run
// (precise-prefix-cache-aware guide: its per-QPS tables and summary across
// QPS; the estimated router is its default approximate prefix scorer with
// the KV and queue scorers, the load router those two alone). Per stage:
// QPS, TTFT p90 (s), output tok/s, completed requests/s.
var llmd73Published = []struct {
	policy, name string
	summary      [2]float64 // TTFT p90 (s), output tok/s
	stages       [][4]float64
}{
	{scheduler.PolicyPrecise, "precise-scheduling", [2]float64{0.542, 8730.0}, [][4]float64{
		{3, 0.498, 1219.1, 2.620}, {10, 0.600, 3902.1, 9.529}, {15, 0.400, 5761.1, 15.544}, {20, 0.600, 9184.5, 20.159},
		{22, 0.500, 9382.0, 22.003}, {25, 0.583, 9242.2, 24.268}, {30, 0.509, 9221.8, 30.992}, {35, 0.500, 9780.6, 32.861},
		{40, 0.488, 10270.8, 40.431}, {43, 0.500, 10054.8, 40.521}, {46, 0.589, 10128.7, 44.630}, {49, 0.600, 10296.5, 48.942},
		{52, 0.507, 10284.6, 52.371}, {55, 0.600, 10140.9, 54.410}, {57, 0.600, 10313.9, 57.655}, {60, 0.500, 10496.9, 59.242}}},
	{scheduler.PolicyApproximate, "estimated-scheduling", [2]float64{31.083, 6944.4}, [][4]float64{
		{3, 0.497, 1310.9, 3.093}, {10, 0.499, 3842.4, 9.386}, {15, 0.400, 5152.9, 13.642}, {20, 0.600, 8082.6, 19.593},
		{22, 0.700, 8415.7, 23.832}, {25, 0.609, 8445.1, 24.510}, {30, 0.708, 8435.9, 30.242}, {35, 2.459, 7443.5, 35.050},
		{40, 43.018, 8045.9, 40.212}, {43, 43.515, 7969.6, 43.120}, {46, 44.930, 7695.2, 45.986}, {49, 46.335, 7455.9, 48.461},
		{52, 47.284, 7452.3, 52.162}, {55, 50.108, 7100.7, 55.860}, {57, 49.930, 7013.8, 56.362}, {60, 50.226, 7247.9, 60.508}}},
	{scheduler.PolicyRandom, "random-scheduling", [2]float64{92.551, 4428.7}, [][4]float64{
		{3, 0.820, 1314.0, 2.752}, {10, 1.398, 3568.5, 9.564}, {15, 2.299, 3791.1, 16.484}, {20, 70.273, 4933.1, 18.838},
		{22, 78.420, 4765.4, 21.986}, {25, 82.943, 4781.3, 23.400}, {30, 86.182, 4636.3, 30.368}, {35, 91.519, 4332.6, 36.403},
		{40, 101.272, 4773.8, 41.192}, {43, 101.142, 4844.6, 42.775}, {46, 101.265, 4969.5, 47.578}, {49, 103.514, 4783.2, 48.305},
		{52, 105.004, 4845.1, 51.544}, {55, 104.321, 4921.7, 53.552}, {57, 106.816, 4764.2, 55.068}, {60, 105.988, 4835.2, 56.912}}},
	{scheduler.PolicyLeastQueue, "load-scheduling", [2]float64{94.865, 4266.4}, [][4]float64{
		{3, 1.609, 1274.8, 2.997}, {10, 4.124, 3607.0, 10.469}, {15, 7.002, 3348.4, 15.152}, {20, 77.707, 4902.5, 22.157},
		{22, 72.972, 4785.5, 21.469}, {25, 85.979, 4872.8, 25.597}, {30, 83.806, 4888.7, 29.711}, {35, 88.086, 4660.7, 35.167},
		{40, 100.911, 4946.4, 39.019}, {43, 101.524, 4973.3, 40.143}, {46, 105.884, 4723.6, 46.688}, {49, 105.015, 4004.8, 49.162},
		{52, 108.572, 3991.0, 54.050}, {55, 110.681, 4671.9, 54.779}, {57, 113.278, 3866.5, 55.837}, {60, 110.184, 4745.1, 59.971}}},
}

// LLMD73Published is the published run beside LLMD73Options(k). A stage's
// Requests are its completed requests/s times the stage's configured
// duration: the report weighs its summary's p90s by successes over the
// stage's measured duration, which it does not print.
func LLMD73Published(k float64) *Published {
	p := &Published{Source: "llm-d benchmark report, 73% capacity run", TokenScale: k}
	for _, r := range llmd73Published {
		pp := PublishedPolicy{Policy: r.policy, Name: r.name,
			Summary: StageSummary{TTFTP90ms: r.summary[0] * 1000, OutputTokPS: r.summary[1], Stages: len(r.stages)}}
		for i, st := range r.stages {
			pp.Stages = append(pp.Stages, StageResult{QPS: st[0], TTFTP90ms: st[1] * 1000, OutputTokPS: st[2],
				Requests: int(st[3]*float64(llmd73Durations[i+1]) + 0.5)})
		}
		p.Policies = append(p.Policies, pp)
	}
	return p
}
