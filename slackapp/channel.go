package slackapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/slack-go/slack"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/notify"
)

// Config configures the app.
type Config struct {
	// Token is the bot token (xoxb-...); the app is off without it.
	Token string
	// SigningSecret verifies interactivity requests; without it the
	// buttons are refused (every click is answered 401).
	SigningSecret string
	// APIURL replaces Slack's Web API base URL (tests); it ends in "/".
	APIURL string
}

// LogValue keeps the secrets out of logs, should c be logged.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(slog.Bool("token_set", c.Token != ""), slog.Bool("signing_secret_set", c.SigningSecret != ""),
		slog.String("api_url", c.APIURL))
}

// String keeps the secrets out of anything that formats c.
func (c Config) String() string {
	return "slackapp.Config{token and signing secret redacted, APIURL: " + c.APIURL + "}"
}

// Client returns the Web API client c configures.
func (c Config) Client() *slack.Client {
	var opts []slack.Option
	if c.APIURL != "" {
		opts = append(opts, slack.OptionAPIURL(c.APIURL))
	}
	return slack.New(c.Token, opts...)
}

// Channel is the notify channel.
type Channel struct {
	api *slack.Client
}

// NewChannel returns the channel; no call is made until a message is sent.
func NewChannel(c Config) (*Channel, error) {
	if c.Token == "" {
		return nil, errors.New("slackapp: a bot token is required")
	}
	return &Channel{api: c.Client()}, nil
}

// Name implements notify.Channel.
func (*Channel) Name() string { return ChannelName }

// Address implements notify.Channel: the directory's e-mail address, which
// Slack maps to the workspace member at send time.
func (*Channel) Address(u *directory.User) string { return u.Email }

// Send implements notify.Channel.
func (c *Channel) Send(ctx context.Context, m notify.Message) error {
	_, err := c.Post(ctx, m)
	return err
}

// Post implements notify.Updater: a direct message to the member with the
// recipient's e-mail address; the reference is "<channel> <ts>".
func (c *Channel) Post(ctx context.Context, m notify.Message) (string, error) {
	u, err := c.api.GetUserByEmailContext(ctx, m.To)
	if err != nil {
		return "", fmt.Errorf("users.lookupByEmail: %w", err)
	}
	ch, ts, err := c.api.PostMessageContext(ctx, u.ID, render(m)...)
	if err != nil {
		return "", fmt.Errorf("chat.postMessage: %w", err)
	}
	return ch + " " + ts, nil
}

// Update implements notify.Updater.
func (c *Channel) Update(ctx context.Context, ref string, m notify.Message) error {
	ch, ts, ok := strings.Cut(ref, " ")
	if !ok {
		return fmt.Errorf("slackapp: bad message reference %q", ref)
	}
	if _, _, _, err := c.api.UpdateMessageContext(ctx, ch, ts, render(m)...); err != nil {
		return fmt.Errorf("chat.update: %w", err)
	}
	return nil
}

// Block Kit's limits: a header's text, a section's text, blocks per message.
const (
	maxHeader  = 150
	maxSection = 3000
)

// render lays m out in Block Kit. Text from the request is plain_text only
// (Slack interprets neither formatting nor mentions there); the fallback
// text, shown in notifications, is the heading with mrkdwn turned off and
// &, <, > escaped. Approve and Deny appear only while the recipient is
// asked to decide and the rule takes decisions through Slack.
func render(m notify.Message) []slack.MsgOption {
	s := m.Summary
	heading := summary.Plain(s.Heading())
	blocks := []slack.Block{
		slack.NewHeaderBlock(plain(clip(heading, maxHeader))),
		section(m.Lead),
	}
	if len(m.Notes.List) > 0 {
		var b strings.Builder
		b.WriteString("WARNING: this request contains hidden or look-alike characters. Each is shown as its code point in angle brackets, such as <U+202E>, in its place; what runs is the text with the character.\n")
		for _, n := range m.Notes.List {
			fmt.Fprintf(&b, "• %s %s (%s) in %s", n.Finding.Code, n.Finding.Name, n.Finding.Why, summary.Plain(n.Where))
			if n.Count > 1 {
				fmt.Fprintf(&b, ", %d times", n.Count)
			}
			b.WriteString("\n")
		}
		blocks = append(blocks, section(b.String()))
	}
	who := summary.Plain(s.Subject)
	if s.Actor != "" {
		who += ", through " + summary.Plain(s.Actor) + ","
	}
	who += " asks to run " + summary.Plain(s.Tool) + "."
	if s.TimeLeft != "" {
		who += "\nTime left: " + s.TimeLeft + " (expires " + s.ExpiresAt.UTC().Format("2006-01-02 15:04:05 MST") + ")"
	}
	blocks = append(blocks, section(who))
	var args strings.Builder
	args.WriteString("What it will do (stated by the requester):\n")
	if len(s.Arguments) == 0 {
		args.WriteString("  No arguments.\n")
	}
	for _, f := range s.Arguments {
		v := summary.Plain(f.Value)
		if f.Multiline {
			v = "\n    " + strings.ReplaceAll(summary.PlainBlock(f.Value), "\n", "\n    ")
		}
		args.WriteString("  " + summary.Plain(f.Name) + ": " + v + "\n")
	}
	blocks = append(blocks, section(args.String()))
	why := "Why approval is needed (from policy):\n"
	if s.Why != "" {
		why += "  " + summary.Plain(s.Why) + "\n"
	}
	blocks = append(blocks, section(why+"  Rule "+summary.Plain(s.Rule)))

	if m.AskDecision && m.Request != nil && m.Request.ApprovalPolicy.AllowsChannel(evaluation.ChannelSlack) {
		open := slack.NewButtonBlockElement(ActionOpen, m.Request.ID, plain("Open the request"))
		open.URL = m.Link
		approve := slack.NewButtonBlockElement(ActionApprove, m.Request.ID, plain("Approve")).WithStyle(slack.StylePrimary)
		deny := slack.NewButtonBlockElement(ActionDeny, m.Request.ID, plain("Deny")).WithStyle(slack.StyleDanger)
		blocks = append(blocks, slack.NewActionBlock(blockActions, open, approve, deny))
	} else if m.AskDecision {
		open := slack.NewButtonBlockElement(ActionOpen, m.Request.ID, plain("Open the request to decide"))
		open.URL = m.Link
		blocks = append(blocks, slack.NewActionBlock(blockActions, open))
	} else {
		// Ended (or for the requester): no buttons, the link as text.
		blocks = append(blocks, slack.NewContextBlock("", slack.NewTextBlockObject(slack.MarkdownType,
			"<"+escape(m.Link)+"|Open the request> (sign-in required)", false, true)))
	}
	return []slack.MsgOption{
		slack.MsgOptionText(m.Subject, true), // slack-go escapes &, <, >
		slack.MsgOptionDisableMarkdown(),
		slack.MsgOptionBlocks(blocks...),
	}
}

func plain(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

func section(s string) *slack.SectionBlock {
	return slack.NewSectionBlock(plain(clip(s, maxSection)), nil, nil)
}

// clip shortens s to at most n characters, saying so.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	const more = "… (shortened; open the request to see it all)"
	r := []rune(s)
	return string(r[:n-utf8.RuneCountInString(more)]) + more
}

// escape is Slack's escaping of the three control characters of mrkdwn and
// links: nothing written through it can open a link or a mention.
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

var (
	_ notify.Channel = (*Channel)(nil)
	_ notify.Updater = (*Channel)(nil)
)
