// The live tail of the caller's key calls: GET /me/api-keys/tail over EventSource, which
// reconnects by itself and resumes with Last-Event-ID. Rows are built with textContent only.
"use strict";
(function () {
  const list = document.getElementById("tail");
  const status = document.getElementById("tail-status");
  if (!list || typeof EventSource !== "function") {
    return;
  }
  const source = new EventSource("/me/api-keys/tail");
  source.addEventListener("open", function () {
    status.textContent = "Live: calls made with your keys appear here as they happen.";
  });
  source.addEventListener("error", function () {
    status.textContent = "Reconnecting…";
  });
  source.addEventListener("call", function (event) {
    const call = JSON.parse(event.data);
    const item = document.createElement("li");
    item.dataset.id = call.id;
    item.textContent = [call.at, "key " + call.key_id, call.method || call.kind,
      call.route || "", call.status || "", call.cost_flow + " FLOW",
      call.request_id || ""].join("  ");
    list.prepend(item);
    while (list.children.length > 200) {
      list.lastElementChild.remove();
    }
  });
})();
