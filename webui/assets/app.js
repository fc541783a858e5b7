// Keeps the page live: every few seconds the main section is fetched again
// (X-Partial asks the server for just that section) and swapped in, unless
// the person is in the middle of typing or choosing. A swap keeps what the
// person had: keyboard focus (on the same link or control of the new
// content), the scroll positions and which <details> were open; and what
// changed is said in the polite live region (#live): new requests, and
// status changes. The server marks what may be announced: an element with
// data-live (a key) and data-live-text; a new key, or new text for a known
// key, is announced. On load, an error message takes the focus.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main) return;
  var error = document.getElementById("error");
  if (error) error.focus();
  if (!main.dataset.refresh) return;
  var live = document.getElementById("live");
  var every = parseInt(main.dataset.refresh, 10) || 3000;
  var last = main.innerHTML; // what the server sent last (an opened <details> changes the DOM, not this)

  function busy() {
    var a = document.activeElement;
    if (a && a !== document.body && main.contains(a) && /^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(a.tagName)) return true;
    // A half-written reason must not be wiped by a refresh.
    return Array.prototype.some.call(main.querySelectorAll("textarea"), function (t) { return t.value !== ""; });
  }

  // where names an element of main so that its counterpart in the new
  // content can be found: by id, else by its link target, else by its place
  // among the elements of its kind.
  function where(el) {
    if (el.id) return { id: el.id };
    var tag = el.tagName, href = el.getAttribute("href");
    var same = Array.prototype.filter.call(main.getElementsByTagName(tag), function (e) {
      return href === null || e.getAttribute("href") === href;
    });
    return { tag: tag, href: href, index: same.indexOf(el) };
  }
  function find(w) {
    if (w.id) return document.getElementById(w.id);
    var same = Array.prototype.filter.call(main.getElementsByTagName(w.tag), function (e) {
      return w.href === null || e.getAttribute("href") === w.href;
    });
    return same[w.index] || null;
  }

  function announcements(root) {
    var m = {};
    Array.prototype.forEach.call(root.querySelectorAll("[data-live]"), function (e) {
      m[e.getAttribute("data-live")] = e.getAttribute("data-live-text") || "";
    });
    return m;
  }

  function swap(html) {
    var before = announcements(main);
    var active = document.activeElement, focus = null;
    if (active && active !== main && main.contains(active)) focus = where(active);
    var open = Array.prototype.map.call(main.querySelectorAll("details"), function (d) {
      return d.open ? where(d) : null;
    }).filter(Boolean);
    var scrolled = Array.prototype.map.call(main.querySelectorAll(".table-wrap"), function (e) {
      return { at: where(e), left: e.scrollLeft };
    });
    var x = window.scrollX, y = window.scrollY;

    main.innerHTML = html;

    open.forEach(function (w) { var d = find(w); if (d) d.open = true; });
    scrolled.forEach(function (s) { var e = find(s.at); if (e) e.scrollLeft = s.left; });
    if (focus) {
      // What had the focus is gone: the section keeps it rather than the page.
      (find(focus) || main).focus({ preventScroll: true });
    }
    window.scrollTo(x, y);

    var after = announcements(main), said = [];
    Object.keys(after).forEach(function (k) {
      if (before[k] !== after[k] && after[k]) said.push(after[k]);
    });
    if (said.length && live) live.textContent = said.join(". ") + ".";
  }

  function refresh() {
    if (document.hidden || busy()) return;
    fetch(window.location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (r.type === "opaqueredirect" || r.status === 401) { window.location.reload(); return null; }
        return r.ok || r.status === 404 ? r.text() : null;
      })
      .then(function (html) {
        if (html === null || html === undefined || busy() || html === last) return;
        last = html;
        swap(html);
      })
      .catch(function () { /* offline: try again next tick */ });
  }
  setInterval(refresh, every);
})();
