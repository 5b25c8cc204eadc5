// hopsmgr dashboard: live updates. The server renders every page; this script only swaps in the new
// main part the server pushes (server-sent events), keeps the log tail scrolled to its end, and shows
// whether the stream is connected. No framework, no network access beyond this master.
"use strict";
(function () {
  var body = document.body;
  var url = body.getAttribute("data-live");
  var dot = document.getElementById("live");
  function scrollLog() {
    var log = document.getElementById("log");
    if (log) { log.scrollTop = log.scrollHeight; }
  }
  scrollLog();
  if (!url || !window.EventSource) { return; }
  var source = new EventSource(url);
  source.addEventListener("open", function () { if (dot) { dot.className = "live on"; } });
  source.addEventListener("error", function () { if (dot) { dot.className = "live off"; } });
  source.addEventListener("main", function (event) {
    var main = document.getElementById("main");
    if (!main) { return; }
    var log = document.getElementById("log");
    var atEnd = !log || log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    main.innerHTML = event.data;
    body.setAttribute("data-updated", String(Date.now()));
    if (atEnd) { scrollLog(); }
  });
  source.addEventListener("gone", function () { source.close(); window.location.reload(); });
  window.addEventListener("pagehide", function () { source.close(); });
})();
