// The live console: re-renders the page's [data-live] sections when something changes.
// No build step and no dependency: a run page follows the run's event stream, the
// dashboard the activity stream of all runs (SSE, read with fetch so every named event
// counts); the workers page polls every few seconds.
(function () {
  "use strict";
  var root = document.querySelector("[data-live-stream],[data-live-poll]");
  if (!root) return;
  var busy = false;
  var again = false;

  function typing(section) {
    // Never throw away what someone is typing (a comment on an approval).
    var fields = section.querySelectorAll("input[type=text], textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i] === document.activeElement || fields[i].value) return true;
    }
    return false;
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (answer) { return answer.ok ? answer.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (section) {
          var next = section.id && fresh.getElementById(section.id);
          if (next && !typing(section)) section.replaceWith(document.importNode(next, true));
        });
        // Sections that exist only now (the approval panel once the run waits) appear.
        fresh.querySelectorAll("[data-live][data-live-after]").forEach(function (next) {
          if (document.getElementById(next.id)) return;
          var anchor = document.getElementById(next.getAttribute("data-live-after"));
          if (anchor) anchor.after(document.importNode(next, true));
        });
        document.querySelectorAll("[data-live][data-live-after]").forEach(function (section) {
          if (!fresh.getElementById(section.id) && !typing(section)) section.remove();
        });
        root.setAttribute("data-live-updated", String(Date.now()));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  var poll = parseFloat(root.getAttribute("data-live-poll") || "0");
  if (poll > 0) window.setInterval(refresh, poll * 1000);

  var stream = root.getAttribute("data-live-stream");
  if (!stream) return;
  var last = root.getAttribute("data-live-last-event") || "0";
  var ended = false;

  function follow() {
    fetch(stream + "?last_event_id=" + encodeURIComponent(last), {
      credentials: "same-origin",
      headers: { Accept: "text/event-stream" },
    }).then(function (answer) {
      if (!answer.ok || !answer.body) throw new Error("stream " + answer.status);
      var reader = answer.body.getReader();
      var decoder = new TextDecoder();
      var buffer = "";
      function read() {
        return reader.read().then(function (chunk) {
          if (chunk.done) return;
          buffer += decoder.decode(chunk.value, { stream: true });
          var frames = buffer.split("\n\n");
          buffer = frames.pop();
          var changed = false;
          frames.forEach(function (frame) {
            frame.split("\n").forEach(function (line) {
              if (line.indexOf("id: ") === 0) { last = line.slice(4); changed = true; }
              if (/^event: agent\.run\.(completed|failed|cancelled|timed_out)$/.test(line)) ended = true;
            });
          });
          if (changed) refresh();
          return read();
        });
      }
      return read();
    }).catch(function () {}).then(function () {
      // The stream ends after the run's terminal event; otherwise reconnect from `last`.
      if (!ended) window.setTimeout(follow, 2000);
    });
  }
  follow();
})();
