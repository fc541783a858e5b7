package evaluation

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Window is a recurring time window, such as a change window: open on the
// listed days between From and To in its time zone.
type Window struct {
	Name string
	Days map[time.Weekday]bool
	From time.Duration // since midnight
	To   time.Duration // since midnight; at most 24h
	Loc  *time.Location
}

type windowSpec struct {
	Days     []string `yaml:"days"`
	From     string   `yaml:"from"`
	To       string   `yaml:"to"`
	Timezone string   `yaml:"timezone"`
	Line     int      `yaml:"-"`
}

func (w *windowSpec) UnmarshalYAML(n *yaml.Node) error {
	if err := checkKeys(n, []string{"days", "from", "to", "timezone"}, "window"); err != nil {
		return err
	}
	type plain windowSpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*w = windowSpec(p)
	w.Line = n.Line
	return nil
}

var weekdays = map[string]time.Weekday{"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday}

func compileWindow(name string, s windowSpec) (*Window, error) {
	w := &Window{Name: name, Days: map[time.Weekday]bool{}, Loc: time.UTC}
	if s.Timezone != "" {
		loc, err := time.LoadLocation(s.Timezone)
		if err != nil {
			return nil, fmt.Errorf("window %q: unknown timezone %q", name, s.Timezone)
		}
		w.Loc = loc
	}
	if len(s.Days) == 0 {
		return nil, fmt.Errorf("window %q: days is required (mon, tue, ...)", name)
	}
	for _, d := range s.Days {
		wd, ok := weekdays[strings.ToLower(d)]
		if !ok {
			return nil, fmt.Errorf("window %q: unknown day %q (use mon, tue, wed, thu, fri, sat, sun)", name, d)
		}
		w.Days[wd] = true
	}
	var err error
	if w.From, err = clock(s.From); err != nil {
		return nil, fmt.Errorf("window %q: from: %w", name, err)
	}
	if w.To, err = clock(s.To); err != nil {
		return nil, fmt.Errorf("window %q: to: %w", name, err)
	}
	if w.From >= w.To {
		return nil, fmt.Errorf("window %q: from must be before to (windows do not cross midnight; use two days)", name)
	}
	return w, nil
}

func clock(s string) (time.Duration, error) {
	var h, m int
	if _, err := fmt.Sscanf(s, "%d:%d", &h, &m); err != nil || h < 0 || h > 24 || m < 0 || m > 59 || (h == 24 && m != 0) {
		return 0, fmt.Errorf("%q is not a time of day like 09:00 or 24:00", s)
	}
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute, nil
}

// Open reports whether the window is open at t.
func (w *Window) Open(t time.Time) bool {
	lt := t.In(w.Loc)
	if !w.Days[lt.Weekday()] {
		return false
	}
	midnight := time.Date(lt.Year(), lt.Month(), lt.Day(), 0, 0, 0, 0, w.Loc)
	since := lt.Sub(midnight)
	return since >= w.From && since < w.To
}

// NextChange returns the first time after t at which the window opens or
// closes (within the next eight days), or the zero time if it never does.
func (w *Window) NextChange(t time.Time) time.Time {
	lt := t.In(w.Loc)
	day := time.Date(lt.Year(), lt.Month(), lt.Day(), 0, 0, 0, 0, w.Loc)
	for i := 0; i <= 8; i++ {
		d := day.AddDate(0, 0, i)
		if !w.Days[d.Weekday()] {
			continue
		}
		for _, edge := range []time.Duration{w.From, w.To} {
			at := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, w.Loc).Add(edge)
			if at.After(t) && w.Open(at) != w.Open(at.Add(-time.Nanosecond)) {
				return at
			}
		}
	}
	return time.Time{}
}
