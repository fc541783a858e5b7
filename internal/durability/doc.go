// Package durability says what a commit survives on the database a process
// runs against, and when a failover could lose one: above all an execution
// claim, the commit that makes a tool run at most once. A claim a failover
// loses is a claim the next replica does not see, and the tool runs again.
//
// Both processes check at start-up (logged, at warn level when at risk)
// and on every readiness probe (/readyz shows the report; a risk is a
// warning, not an outage). The check is one query of settings any role may
// read, and one of pg_stat_replication, whose details need pg_monitor (or
// a superuser): without them the standbys are reported unknown.
//
// The rule (docs/reliability.md, "Durability and failover settings"): a
// committed claim can be lost when
//
//   - synchronous_commit is off (a crash loses the last commits too), or
//   - the server can have standbys (wal_level is not minimal and
//     max_wal_senders is above zero) and synchronous_standby_names is
//     empty: a standby promoted in a failover may lack the last commits, or
//   - a synchronous standby is configured and synchronous_commit is local:
//     commits do not wait for it.
//
// With a synchronous standby configured and synchronous_commit on,
// remote_apply or remote_write, a commit is acknowledged only once the
// synchronous standby has it (remote_write: in its operating system's
// memory, lost only if that standby's machine fails with the primary).
package durability
