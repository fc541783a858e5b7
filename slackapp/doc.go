// Package slackapp is arap's Slack app: a notify channel that sends each
// person asked to decide a request one direct message (found by their
// directory e-mail address through users.lookupByEmail), updated in place as
// the request goes on and when it ends; and the interactivity endpoint
// behind the message's Approve and Deny buttons.
//
// A click is trusted only as far as Slack's request signature proves it
// came from Slack (v0 HMAC-SHA256 with the signing secret, timestamp within
// five minutes, each signature accepted once however its hex is spelled:
// arap.slack_signatures, which this package owns). The clicking Slack user is a directory user only
// through the e-mail address Slack has confirmed for them (users.info,
// is_email_confirmed); the vote is then that person's, through
// requests.Service.Decide with channel slack: the same eligibility,
// separation of duties and quorum as the web UI. Anyone Slack cannot vouch
// for, or whom the request does not accept, is told why in an ephemeral
// message, and nothing is recorded.
//
// Everything from a request is written as plain_text (never mrkdwn), so an
// argument cannot format the message, link or mention anyone; hidden
// characters appear as the web UI's markers (<U+202E>).
package slackapp
