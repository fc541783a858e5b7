package pep

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/omcp/arap/agentauth"
	"github.com/omcp/arap/internal/dbdown"
	"github.com/omcp/arap/mcp/tasks"
)

// Who is calling: a caller token (callers.go) or an OAuth access token
// (package agentauth) becomes the request's principal before the SDK sees
// the request, and a refusal says why, with its challenge.

type principalKey struct{}

// authenticate requires a caller token and records its principal. The SDK
// passes it to handlers as TokenInfo (via auth.RequireBearerToken, which
// here only relays what was already checked). With an anonymous principal
// configured (conformance fixture mode), a request with no Authorization
// header at all gets that principal.
func (s *Server) authenticate(next http.Handler) http.Handler {
	relay := auth.RequireBearerToken(func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p, ok := r.Context().Value(principalKey{}).(Principal)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: p.Key(), Expiration: time.Now().Add(time.Hour), Extra: map[string]any{"principal": p}}, nil
	}, nil)(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		if h == "" && s.anon != nil {
			anon := *s.anon
			anon.anonymous = true
			ctx := context.WithValue(r.Context(), principalKey{}, anon)
			r = r.Clone(tasks.WithPrincipal(ctx, s.anon.Key()))
			r.Header.Set("Authorization", "Bearer anonymous") // the SDK's relay wants one; the principal is already decided
			relay.ServeHTTP(w, r)
			return
		}
		scheme, token, _ := strings.Cut(h, " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			unauthorized(w, s.challenge(nil), "a bearer token is required")
			return
		}
		var p Principal
		var err error
		if s.agents != nil && agentauth.LooksLikeJWT(token) {
			p, err = s.agent(r.Context(), token)
		} else {
			p, err = s.gate.callers.Authenticate(r.Context(), token)
			if errors.Is(err, ErrUnknownCaller) && s.agents != nil {
				p, err = s.agent(r.Context(), token) // an opaque OAuth token, introspected
			}
		}
		if errors.Is(err, agentauth.ErrInsufficientScope) {
			s.log.InfoContext(r.Context(), "access token refused", "reason", err.Error())
			w.Header().Set("WWW-Authenticate", s.challenge(err))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "insufficient_scope", "error_description": err.Error()})
			return
		}
		if errors.Is(err, agentauth.ErrInvalidToken) {
			s.log.InfoContext(r.Context(), "access token refused", "reason", err.Error())
			unauthorized(w, s.challenge(err), "the access token is not accepted: "+strings.TrimPrefix(err.Error(), agentauth.ErrInvalidToken.Error()+": "))
			return
		}
		if errors.Is(err, ErrUnknownCaller) {
			unauthorized(w, s.challenge(err), "the bearer token is unknown or revoked")
			return
		}
		if err != nil {
			if dbdown.Is(err) {
				s.log.WarnContext(r.Context(), "caller lookup: database unavailable", "error", err)
				tasks.WriteUnavailable(w, r, tasks.WhatDatabase)
				return
			}
			s.log.ErrorContext(r.Context(), "caller lookup failed", "error", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		noteCaller(r.Context(), p.Name)
		ctx := context.WithValue(r.Context(), principalKey{}, p)
		relay.ServeHTTP(w, r.WithContext(tasks.WithPrincipal(ctx, p.Key())))
	})
}

// tooMany answers a caller over its budget (HTTP 429; the limiter has set
// Retry-After).
func tooMany(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": "rate_limited",
		"error_description": "too many requests; retry after the number of seconds in Retry-After"})
}

func unauthorized(w http.ResponseWriter, challenge, msg string) {
	w.Header().Set("WWW-Authenticate", challenge)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": "unauthorized", "error_description": msg})
}

// challenge is the WWW-Authenticate value of a refusal for err (nil: no
// token was given): with OAuth on, it names the protected resource
// metadata (RFC 9728).
func (s *Server) challenge(err error) string {
	if s.agents != nil {
		return s.agents.Challenge(err)
	}
	if err != nil {
		return `Bearer realm="arap-mcp", error="invalid_token"`
	}
	return `Bearer realm="arap-mcp"`
}

// agent authenticates an OAuth access token: its subject, through its
// actor chain, for its issuer.
func (s *Server) agent(ctx context.Context, token string) (Principal, error) {
	id, err := s.agents.Verify(ctx, token)
	if err != nil {
		return Principal{}, err
	}
	p := Principal{Name: "oauth:" + id.ClientID, SubjectType: "user", SubjectID: id.Subject, Issuer: id.Issuer, ClientID: id.ClientID}
	if len(id.Actors) > 0 {
		p.ActorID, p.Prior = id.Actors[0], id.Actors[1:]
	}
	return p, nil
}
