package ratelimit

// SetBatch overrides the batch size derived from the limit (benchmarks
// measure the statement per request with 1).
func SetBatch(l *Limiter, n int) { l.batch = n }
