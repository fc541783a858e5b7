package webhook_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/omcp/arap/webhook"
)

// A PEP verifies the backend's callbacks as middleware around its handler;
// the handler sees only verified callbacks, each webhook-id once.
func ExampleVerifier_Middleware() {
	secret := webhook.NewSecret() // in a PEP: os.Getenv("ARAP_WEBHOOK_SECRET")
	v, err := webhook.NewVerifier(secret)
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/arap-callback", v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		b, err := webhook.ParseBody(raw)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Println("wake task", b.State, "for request", b.Task.ID)
		w.WriteHeader(http.StatusNoContent)
	})))

	// What the backend sends.
	body := `{"state":"tsk_1","task":{"id":"arq_1","status":"approved"}}`
	key, _ := webhook.ParseSecret(secret)
	ts := time.Now().Unix()
	send := func() int {
		r := httptest.NewRequest(http.MethodPost, "/arap-callback", strings.NewReader(body))
		r.Header.Set(webhook.HeaderID, "msg_1")
		r.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
		r.Header.Set(webhook.HeaderSignature, webhook.Sign(key, "msg_1", ts, []byte(body)))
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	fmt.Println(send())
	fmt.Println(send(), "(a copy: answered, not handled again)")
	// Output:
	// wake task tsk_1 for request arq_1
	// 204
	// 200 (a copy: answered, not handled again)
}
