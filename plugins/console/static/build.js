// Watch a build: the project's stream over EventSource (which reconnects by itself with
// Last-Event-ID, so a reconnect resumes without duplicates; ids are also checked here).
// The plan's steps are pending, running, done or failed: each step of a plan ends with a
// commit, so the n-th commit finishes the n-th step; "done" settles them all.
"use strict";
(function () {
  const build = document.getElementById("build");
  if (!build || typeof EventSource !== "function") {
    return;
  }
  const publicUrl = build.dataset.publicUrl;
  const stepsList = document.getElementById("steps");
  const status = document.getElementById("build-status");
  let steps = [];
  let commits = 0;
  let finished = null;
  let lastId = 0;

  // URLs under the service's public URL are loaded from this page's own origin.
  function local(url) {
    return url.startsWith(publicUrl + "/") ? url.slice(publicUrl.length) : url;
  }

  function item(text, className) {
    const li = document.createElement("li");
    li.textContent = text;
    if (className) {
      li.className = className;
    }
    return li;
  }

  function renderSteps() {
    stepsList.replaceChildren(...steps.map(function (title, index) {
      let state = "pending";
      if (index < commits || finished === "completed") {
        state = "done";
      } else if (index === commits) {
        state = finished ? "failed" : "running";
      }
      const li = item(title + " (" + state + ")", "step " + state);
      li.dataset.state = state;
      return li;
    }));
  }

  const handlers = {
    plan: function (data) { steps = data.steps; commits = 0; finished = null; renderSteps(); },
    commit: function (data) {
      commits += 1;
      document.getElementById("commits").append(
        item(data.sha.slice(0, 10) + " " + data.message + " (" + data.files.join(", ") + ")"));
      renderSteps();
    },
    screenshot: function (data) {
      const figure = document.createElement("figure");
      const image = document.createElement("img");
      image.src = local(data.url);
      image.alt = data.caption || "Screenshot of the build";
      figure.append(image);
      if (data.caption) {
        const caption = document.createElement("figcaption");
        caption.textContent = data.caption;
        figure.append(caption);
      }
      document.getElementById("screenshots").append(figure);
    },
    done: function (data) {
      finished = data.finalStatus;
      renderSteps();
      status.textContent = "Run " + data.finalStatus + ".";
      document.getElementById("project-status").textContent = data.finalStatus;
      if (data.previewUrl) {
        const frame = document.getElementById("preview");
        frame.src = local(data.previewUrl);
        frame.hidden = false;
      }
    },
  };

  const source = new EventSource(build.dataset.stream);
  source.addEventListener("error", function () { status.textContent = "Reconnecting…"; });
  ["plan", "tool_call", "tool_result", "message", "screenshot", "commit", "error", "done"]
    .forEach(function (name) {
      source.addEventListener(name, function (event) {
        const id = Number(event.lastEventId);
        if (id && id <= lastId) {
          return;  // seen already
        }
        lastId = id || lastId;
        const data = JSON.parse(event.data);
        const log = document.getElementById("events");
        const line = item(event.lastEventId + " " + name + " " + event.data.slice(0, 300));
        line.dataset.id = event.lastEventId;
        log.append(line);
        if (handlers[name]) {
          handlers[name](data);
        }
      });
    });
})();
