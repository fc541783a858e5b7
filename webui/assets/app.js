// Keeps the page live: every few seconds the main section is fetched again
// (X-Partial asks the server for just that section) and swapped in, unless
// the person is in the middle of typing or choosing.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !main.dataset.refresh) return;
  var every = parseInt(main.dataset.refresh, 10) || 3000;
  function busy() {
    var a = document.activeElement;
    if (a && a !== document.body && main.contains(a) && /^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(a.tagName)) return true;
    // A half-written reason must not be wiped by a refresh.
    return Array.prototype.some.call(main.querySelectorAll("textarea"), function (t) { return t.value !== ""; });
  }
  function refresh() {
    if (document.hidden || busy()) return;
    fetch(window.location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (r.type === "opaqueredirect" || r.status === 401) { window.location.reload(); return null; }
        return r.ok || r.status === 404 ? r.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== undefined && !busy() && html !== main.innerHTML) main.innerHTML = html;
      })
      .catch(function () { /* offline: try again next tick */ });
  }
  setInterval(refresh, every);
})();
