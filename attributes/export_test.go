package attributes

// AfterRead sets f to run between a reload's read and its generation check.
func (s *Store) AfterRead(f func()) { s.afterRead = f }

// Generation is how many times the cache has been emptied.
func (s *Store) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}
