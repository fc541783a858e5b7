package slackapp

import "github.com/omcp/arap/evaluation"

// Wire names of the app's message: action ids of its buttons (each
// button's value is the request id).
const (
	ActionApprove = "arap_approve"
	ActionDeny    = "arap_deny"
	ActionOpen    = "arap_open"
	blockActions  = "arap_decide"
)

// ChannelName is the notify channel's name (deliveries, metrics); votes
// through the app carry evaluation.ChannelSlack.
const ChannelName = evaluation.NotifySlack
