// Package callbacks delivers ARAP callbacks: when an access request ends,
// each callback the submitter registered for that event is POSTed, signed
// the Standard Webhooks way by package webhook (webhook-id,
// webhook-timestamp, webhook-signature: HMAC-SHA256 over "id.timestamp.body"
// with the client's secret), at least once, retried with backoff. The
// delivery job is enqueued in the transaction that ends the request, so a
// crash cannot lose it. It owns arap.deliveries, arap.delivery_attempts,
// arap.webhook_secrets and arap.webhook_targets: named outgoing webhooks
// (targets.go) that package notify posts to through PostTarget, signed and
// checked exactly as callbacks are.
//
// Callbacks only wake the receiver: the body (webhook.Body) carries the task
// handle and never the approval, and the status endpoint stays
// authoritative. Receivers verify with webhook.Verifier.
package callbacks
