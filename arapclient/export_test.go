package arapclient

import "time"

// WithTimer sets the timer Wait pauses with, so a test sees each pause.
func WithTimer(o WaitOptions, after func(time.Duration) <-chan time.Time) WaitOptions {
	o.after = after
	return o
}

// Subscribe registers a wait on task id, as Wait does.
func (cb *Callbacks) Subscribe(id string) (<-chan struct{}, func()) { return cb.subscribe(id) }
