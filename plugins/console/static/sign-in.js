// Sign in with a browser wallet (EIP-1193 window.ethereum): the address, the SIWE message of
// POST /auth/nonce, personal_sign, then POST /auth/verify sets the session cookie.
"use strict";
(function () {
  const button = document.getElementById("wallet-sign-in");
  const status = document.getElementById("wallet-status");
  const wallet = window.ethereum;
  if (!wallet || typeof wallet.request !== "function") {
    status.textContent = "No browser wallet found: use an access code.";
    return;
  }
  button.disabled = false;

  async function post(path, body) {
    const response = await fetch(path, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = answer.error || {};
      throw new Error((error.code || response.status) + ": " + (error.message || "refused"));
    }
    return answer;
  }

  button.addEventListener("click", async function () {
    button.disabled = true;
    status.textContent = "Waiting for the wallet…";
    try {
      const [address] = await wallet.request({method: "eth_requestAccounts"});
      const issued = await post("/auth/nonce", {address: address});
      const hex = "0x" + Array.from(new TextEncoder().encode(issued.message),
        (byte) => byte.toString(16).padStart(2, "0")).join("");
      const signature = await wallet.request({method: "personal_sign", params: [hex, address]});
      await post("/auth/verify", {address: address, message: issued.message, signature: signature});
      status.textContent = "Signed in.";
      window.location.assign("/console/keys");
    } catch (error) {
      status.textContent = "Sign-in failed: " + (error && error.message ? error.message : error);
      button.disabled = false;
    }
  });
})();
