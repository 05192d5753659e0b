/* Web workers for pages opened from disk (file://), where browsers refuse to start
 * them: on file:// only, Worker runs the worker's script in a hidden frame instead, with
 * postMessage, message events and importScripts (returning a promise, loading one
 * script after another). The documentation's search runs in such a worker. */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  function load(doc, urls) {
    return urls.reduce(function (done, url) {
      return done.then(function () {
        return new Promise(function (resolve, reject) {
          var script = doc.createElement("script");
          script.src = url; script.onload = resolve; script.onerror = reject;
          doc.body.appendChild(script);
        });
      });
    }, Promise.resolve());
  }

  function FileWorker(url) {
    var target = new EventTarget(), frame = document.createElement("iframe");
    frame.style.display = "none";
    document.body.appendChild(frame);
    var scope = frame.contentWindow, doc = frame.contentDocument;
    doc.open(); doc.write("<!DOCTYPE html><html><body></body></html>"); doc.close();
    var ready = new Promise(function (resolve) {
      scope.postMessage = function (data) {
        setTimeout(function () {
          var event = new MessageEvent("message", {data: data});
          if (typeof target.onmessage === "function") target.onmessage(event);
          target.dispatchEvent(event);
        }, 0);
      };
      scope.importScripts = function () { return load(doc, Array.prototype.slice.call(arguments)); };
      load(doc, [new URL(url, location.href).href]).then(resolve);
    });
    target.postMessage = function (data) {
      ready.then(function () { scope.dispatchEvent(new scope.MessageEvent("message", {data: data})); });
    };
    target.terminate = function () { frame.remove(); };
    return target;
  }

  window.Worker = FileWorker;
})();
