// Passkeys: registering one (the Passkeys page), and signing a decision on
// a request whose rule requires it (the request page's form carries
// data-passkey, the URL to ask for the signing options). The server
// derives the challenge and fixes the approval window; this script only
// carries the options to the browser's authenticator and the response
// back. Listeners are on the document, so they survive the page's
// refreshes; the signed decision is posted through a form of its own for
// the same reason.
(function () {
  "use strict";
  if (!window.PublicKeyCredential) return;

  function b64u(buf) {
    var s = "", bytes = new Uint8Array(buf);
    for (var i = 0; i < bytes.length; i++) s += String.fromCharCode(bytes[i]);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  function unb64u(s) {
    s = s.replace(/-/g, "+").replace(/_/g, "/");
    while (s.length % 4) s += "=";
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out.buffer;
  }
  function post(url, fields) {
    return fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(fields)
    }).then(function (r) {
      return r.json().catch(function () { return { error: r.statusText }; }).then(function (j) {
        if (!r.ok) throw new Error(j.error || r.statusText);
        return j;
      });
    });
  }
  function showError(msg) {
    var el = document.getElementById("passkey-error");
    if (!el) {
      el = document.createElement("p");
      el.id = "passkey-error";
      el.className = "error";
      el.setAttribute("role", "alert");
      el.tabIndex = -1;
      var form = document.getElementById("decide-form");
      (form ? form.parentNode : document.getElementById("main")).insertBefore(el, form);
    }
    el.textContent = msg;
    el.hidden = false;
    el.focus();
  }
  function failed(e) {
    showError(e && e.name === "NotAllowedError"
      ? "The passkey was not used (cancelled, timed out, or not one registered here). Nothing was recorded."
      : (e && e.message) || String(e));
  }

  function register(form) {
    var csrf = form.elements.csrf.value;
    post(form.dataset.register, { csrf: csrf }).then(function (res) {
      // With a passkey already, one of them approves the new one first.
      var approved = res.step_up ? get(res.step_up).then(JSON.stringify) : Promise.resolve("");
      return approved.then(function (stepUp) { return create(res, stepUp); });
    }).then(function (done) { window.location.assign(done.next); }, failed);

    function create(res, stepUp) {
      var pk = res.options.publicKey;
      pk.challenge = unb64u(pk.challenge);
      pk.user.id = unb64u(pk.user.id);
      (pk.excludeCredentials || []).forEach(function (c) { c.id = unb64u(c.id); });
      return navigator.credentials.create({ publicKey: pk }).then(function (cred) {
        var credential = {
          id: cred.id, rawId: b64u(cred.rawId), type: cred.type,
          response: {
            attestationObject: b64u(cred.response.attestationObject),
            clientDataJSON: b64u(cred.response.clientDataJSON),
            transports: cred.response.getTransports ? cred.response.getTransports() : []
          },
          clientExtensionResults: cred.getClientExtensionResults()
        };
        return post(form.dataset.register + "/finish", {
          csrf: csrf, ceremony: res.ceremony, name: form.elements.name.value, credential: JSON.stringify(credential), step_up: stepUp
        });
      });
    }
  }

  // get asks the authenticator to sign the options' challenge and returns
  // the assertion as the server stores it.
  function get(options) {
    var pk = options.publicKey;
    pk.challenge = unb64u(pk.challenge);
    (pk.allowCredentials || []).forEach(function (c) { c.id = unb64u(c.id); });
    return navigator.credentials.get({ publicKey: pk }).then(function (a) {
      var assertion = {
        credential_id: b64u(a.rawId),
        authenticator_data: b64u(a.response.authenticatorData),
        client_data_json: b64u(a.response.clientDataJSON),
        signature: b64u(a.response.signature)
      };
      if (a.response.userHandle) assertion.user_handle = b64u(a.response.userHandle);
      return assertion;
    });
  }

  function decide(form, decision) {
    var csrf = form.elements.csrf.value;
    var reason = form.elements.reason ? form.elements.reason.value : "";
    // The validity the page shows is the one signed (the server refuses it
    // if it is out of date).
    var shown = document.getElementById("approval-until");
    var until = decision === "approve" && shown ? shown.getAttribute("datetime") : "";
    post(form.dataset.passkey, { csrf: csrf, decision: decision, until: until }).then(function (res) {
      return get(res.options).then(function (assertion) {
        var out = document.createElement("form");
        out.method = "post";
        out.action = form.action;
        out.hidden = true;
        var fields = { csrf: csrf, decision: decision, reason: reason, ceremony: res.ceremony, assertion: JSON.stringify(assertion) };
        Object.keys(fields).forEach(function (k) {
          var i = document.createElement("input");
          i.type = "hidden";
          i.name = k;
          i.value = fields[k];
          out.appendChild(i);
        });
        document.body.appendChild(out);
        out.submit();
      });
    }).catch(failed);
  }

  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.id === "register-form" && form.dataset.register) {
      e.preventDefault();
      register(form);
    } else if (form.id === "decide-form" && form.dataset.passkey) {
      e.preventDefault();
      decide(form, e.submitter ? e.submitter.value : "");
    }
  });
})();
