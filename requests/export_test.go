package requests

// SetUseHooks sets s's hooks around Use: before runs before its
// transaction, while inside it once the approval is locked and marked used.
func SetUseHooks(s *ApprovalStore, before, while func()) { s.beforeUse, s.whileUsing = before, while }
