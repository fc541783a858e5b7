// Package notify tells people about access requests: the deciders that a
// request waits for them, the other deciders of each vote, and the
// requester (and the deciders) of the outcome.
//
// It owns two tables. arap.notification_events is an outbox: requests
// records an event through the requests.Events seam inside the transaction
// of the state change, so an event exists if and only if its change does.
// A dispatch in every replica, each second, enqueues each undispatched event's fan-out job and
// marks it dispatched in one transaction, so a crash after the change's
// commit leaves a row that a surviving or restarted replica dispatches,
// and the change pays for no River insert. The fan-out
// resolves the recipients (the people the request's approval policy names
// and may decide it, through the directory; the requester on the outcome)
// and writes arap.notification_deliveries, one row per (event, recipient,
// channel) under that primary key, each with its delivery job in the same
// transaction. A delivery is sent while its row is locked and marked sent
// in the same transaction, so two replicas never send one delivery at
// once; a crash after the send and before the commit sends it again
// (at least once). Failed sends are retried by River with backoff.
//
// The channels are e-mail (people) and webhook (the operator's named
// targets, such as an ITSM system's, sent by package callbacks' signer and
// SSRF checks through the Poster seam); a rule's notify section, stored
// with the request, picks them (e-mail only without one).
//
// A message is what the request page shows first (internal/summary, the
// function the page itself uses) and a link carrying only the request id;
// never binding tokens, approval states, evaluation ids or secrets.
package notify
