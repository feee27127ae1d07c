// The installable console (phone.md "Installable"): registers the service worker (`/sw.js`,
// scope `/`, which keeps the app shell for opening without a network) and says when the browser
// is offline: the banner "Offline", and "offline" in the connection status when no session's
// event stream is saying "reconnecting" there already. A console opened offline (from the
// worker's cache) could load nothing from the API: when the network comes back it loads again,
// at the place it was opened at.
//
// Imported by main.js before it starts, so `openedAt` is the location hash as the page opened
// (main.js rewrites it when the session it names cannot be loaded).

const $ = (id) => document.getElementById(id);
const openedAt = location.hash;
const openedOffline = !navigator.onLine;

export function registerServiceWorker(container = navigator.serviceWorker) {
  // Absent where the page is not a secure context (plain HTTP to another host than loopback).
  if (!container) return;
  container.register("/sw.js", { scope: "/" }).catch((error) => console.warn("service worker not registered:", error));
}

function showNetworkState() {
  const offline = !navigator.onLine;
  const connection = $("connection");
  $("offline").hidden = !offline;
  if (offline && connection.dataset.status !== "reconnecting") {
    connection.textContent = "offline";
    connection.dataset.status = "offline";
  } else if (!offline && connection.dataset.status === "offline") {
    connection.textContent = "";
    delete connection.dataset.status;
  }
}

window.addEventListener("offline", showNetworkState);
window.addEventListener("online", () => {
  if (openedOffline) {
    history.replaceState(null, "", location.pathname + openedAt);
    location.reload();
    return;
  }
  showNetworkState();
});
// After main.js's first synchronous steps (the sign-in screen clears the status).
setTimeout(showNetworkState, 0);
registerServiceWorker();
