package slackapp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/slack-go/slack"

	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/requests"
)

// MaxBody bounds an interactivity request (a block_actions payload carries
// the whole message, a few kB; Slack's own limits keep it well under this).
const MaxBody = 256 << 10

// Tolerance is how far a request's timestamp may be from now (slack-go's
// verifier applies it); a signature is remembered this long and a little
// more, to refuse its replay.
const Tolerance = 5 * time.Minute

// ErrUnauthenticated refuses a request Slack's signature does not prove:
// missing or wrong signature, a timestamp out of tolerance, or a replay.
var ErrUnauthenticated = errors.New("slackapp: the request is not signed by Slack, is stale, or was seen before")

// Decider records votes (requests.Service).
type Decider interface {
	Decide(ctx context.Context, v requests.Voter, id string, d requests.Decision) (*requests.Request, error)
}

// People lists the directory (directory.Store).
type People interface {
	Users(ctx context.Context) ([]*directory.User, error)
}

// App answers the interactivity endpoint.
type App struct {
	api      *slack.Client
	secret   string
	db       *pgxpool.Pool
	requests Decider
	people   People
	log      *slog.Logger
}

// NewApp returns the interactivity side of the app.
func NewApp(c Config, db *pgxpool.Pool, d Decider, people People, log *slog.Logger) (*App, error) {
	if c.Token == "" || db == nil || d == nil || people == nil {
		return nil, errors.New("slackapp: token, database, requests and directory are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &App{api: c.Client(), secret: c.SigningSecret, db: db, requests: d, people: people, log: log}, nil
}

// Interact handles one interactivity request: header and body as received
// (the body at most MaxBody bytes). It returns ErrUnauthenticated, and
// records nothing, unless Slack's signature proves the request and it is
// the first with that signature. Anything after that is answered to the
// person in Slack, ephemerally; the error is then nil (Slack shows the
// person nothing for an HTTP error) unless the backend failed.
func (a *App) Interact(ctx context.Context, header http.Header, body []byte) error {
	if a.secret == "" {
		return ErrUnauthenticated
	}
	sv, err := slack.NewSecretsVerifier(header, a.secret)
	if err != nil {
		return ErrUnauthenticated
	}
	if _, err := sv.Write(body); err != nil {
		return ErrUnauthenticated
	}
	if err := sv.Ensure(); err != nil {
		return ErrUnauthenticated
	}
	key, ok := replayKey(header)
	if !ok {
		return ErrUnauthenticated
	}
	if fresh, err := a.firstSeen(ctx, key); err != nil {
		return err
	} else if !fresh {
		return ErrUnauthenticated
	}

	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil // signed by Slack but not a form: nothing to do
	}
	var cb slack.InteractionCallback
	if err := json.Unmarshal([]byte(form.Get("payload")), &cb); err != nil || cb.Type != slack.InteractionTypeBlockActions {
		return nil
	}
	for _, act := range cb.ActionCallback.BlockActions {
		switch act.ActionID {
		case ActionApprove, ActionDeny:
			return a.decide(ctx, &cb, act.Value, act.ActionID == ActionApprove)
		}
	}
	return nil // the Open button (a link) and anything else
}

// replayKey is what the verifier proved, not the header's spelling of it:
// the HMAC decoded from its hex (accepted in either case) and written back
// as Slack writes it, "v0=" and lower case. So one click is one key however
// its signature is spelled, and a click as Slack sends it keeps the key
// earlier versions stored (the raw header), whose rows still refuse it.
func replayKey(header http.Header) (string, bool) {
	hexSig, ok := strings.CutPrefix(header.Get("X-Slack-Signature"), "v0=")
	mac, err := hex.DecodeString(hexSig)
	if !ok || err != nil || len(mac) != sha256.Size {
		return "", false
	}
	return "v0=" + hex.EncodeToString(mac), true
}

// firstSeen records signature and reports whether it is new. Signatures
// older than the tolerance are purged on the way: their requests fail the
// timestamp check.
func (a *App) firstSeen(ctx context.Context, signature string) (bool, error) {
	sum := sha256.Sum256([]byte(signature))
	now := time.Now()
	if _, err := a.db.Exec(ctx, `DELETE FROM arap.slack_signatures WHERE seen_at < $1`, now.Add(-2*Tolerance)); err != nil {
		return false, fmt.Errorf("slackapp: purge signatures: %w", err)
	}
	tag, err := a.db.Exec(ctx, `INSERT INTO arap.slack_signatures (signature, seen_at) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		hex.EncodeToString(sum[:]), now)
	if err != nil {
		return false, fmt.Errorf("slackapp: record signature: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// decide records the clicking person's vote, or tells them why not.
func (a *App) decide(ctx context.Context, cb *slack.InteractionCallback, id string, approve bool) error {
	tell := func(text string) error {
		if _, err := a.api.PostEphemeralContext(ctx, cb.Channel.ID, cb.User.ID, slack.MsgOptionText(text, true)); err != nil {
			return fmt.Errorf("slackapp: chat.postEphemeral: %w", err)
		}
		return nil
	}
	u, why, err := a.person(ctx, cb.User.ID)
	if err != nil {
		return err
	}
	if u == nil {
		a.log.Info("slack decision refused", "request_id", id, "slack_user", cb.User.ID, "reason", why)
		return tell("Your decision was not recorded: " + why)
	}
	v := requests.InSlack(requests.UserVoter(u.Name, u.Identities(), u.Groups))
	_, err = a.requests.Decide(ctx, v, id, requests.Decision{Approve: approve})
	var refusal *requests.Error
	switch {
	case errors.As(err, &refusal):
		a.log.Info("slack decision refused", "request_id", id, "voter", v.ID, "code", refusal.Code)
		return tell("Your decision was not recorded: " + refusal.Detail)
	case err != nil:
		_ = tell("Your decision could not be recorded because of an error on our side; try again or open the request.")
		return err
	}
	verb := "approval"
	if !approve {
		verb = "denial"
	}
	return tell("Your " + verb + " is recorded, as " + u.Name + ".")
}

// person is the active directory user whose e-mail address Slack has
// confirmed for Slack user id; nil with the reason when there is none.
func (a *App) person(ctx context.Context, id string) (*directory.User, string, error) {
	su, err := a.api.GetUserInfoContext(ctx, id)
	if err != nil {
		return nil, "", fmt.Errorf("slackapp: users.info: %w", err)
	}
	email := strings.TrimSpace(su.Profile.Email)
	if email == "" || !su.IsEmailConfirmed {
		return nil, "your Slack account has no confirmed e-mail address, so it cannot be matched to an approver.", nil
	}
	users, err := a.people.Users(ctx)
	if err != nil {
		return nil, "", err
	}
	var found []*directory.User
	for _, u := range users {
		if u.Email != "" && strings.EqualFold(u.Email, email) {
			found = append(found, u)
		}
	}
	switch {
	case len(found) == 0:
		return nil, "no approver has your Slack e-mail address.", nil
	case len(found) > 1:
		// Two accounts share the address (a local one and one from single
		// sign-on, say): which person pressed cannot be told, so neither.
		return nil, "more than one approver account has your Slack e-mail address, so which one you are cannot be told; decide in the web UI, or ask an administrator to keep the address on one account.", nil
	case found[0].DisabledAt != nil:
		return nil, "your approver account is disabled.", nil
	}
	return found[0], "", nil
}
